"""Exact prompt lengths from a Hugging Face tokenizer file (`[endpoint] tokenizer`), for servers
with no `/tokenize` (Dynamo's frontend, SGLang, TGI, a hosted API): the text through the model's
chat template, then its tokenizer, as the server will count it. Needs the `tokenizers` library
(`pip install 'kvbench[tokenizer]'`); the template is rendered with jinja2 in a sandbox, as
Hugging Face's `apply_chat_template` renders it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness.core.errors import InputError

Counter = Callable[[str], Awaitable[int]]


def _files(path: Path) -> tuple[Path, Path | None]:
    """tokenizer.json, and tokenizer_config.json beside it (where the chat template is)."""
    if path.is_dir():
        tok, config = path / "tokenizer.json", path / "tokenizer_config.json"
    else:
        tok, config = path, path.with_name("tokenizer_config.json")
    if not tok.is_file():
        raise InputError(f"endpoint.tokenizer: no tokenizer.json at {path} (give the file or its folder)")
    return tok, config if config.is_file() else None


def _template(config: Path | None) -> tuple[str | None, dict[str, str]]:
    """The chat template and the special tokens it may name (bos_token, eos_token)."""
    if config is None:
        return None, {}
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"endpoint.tokenizer: {config}: not a JSON tokenizer config: {e}") from None
    if not isinstance(data, dict):
        raise InputError(f"endpoint.tokenizer: {config}: expected a JSON object")
    template = data.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    specials = {}
    for name in ("bos_token", "eos_token"):
        v = data.get(name)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            specials[name] = v
    if template is not None and not isinstance(template, str):
        raise InputError(f"endpoint.tokenizer: {config}: chat_template: expected text")
    beside = config.parent / "chat_template.jinja"  # where transformers has saved it since 4.43
    if template is None and beside.is_file():
        try:
            template = beside.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"endpoint.tokenizer: {beside}: not readable: {e}") from None
    return template, specials


def counter(path: str, api: str) -> tuple[Counter, str]:
    """The counter, and how run.json says lengths were counted."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError(
            "endpoint.tokenizer: counting with a tokenizer file needs the tokenizers library: "
            "pip install 'kvbench[tokenizer]'"
        ) from None
    tok_file, config = _files(Path(path))
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:  # the library's own error type for any bad file
        raise InputError(f"endpoint.tokenizer: {tok_file}: not a tokenizer file: {e}") from None
    template, specials = _template(config)
    if api == "completions" or template is None:
        if api == "chat":
            raise InputError(
                f"endpoint.tokenizer: {path}: no chat_template in tokenizer_config.json or chat_template.jinja "
                "beside it: a chat request's length depends on it"
            )

        async def count_text(text: str) -> int:
            return len(tok.encode(text).ids)

        return count_text, f"tokenizer file {tok_file} (prompt as sent)"
    render = _renderer(template, specials)

    async def count_chat(text: str) -> int:
        return len(tok.encode(render(text), add_special_tokens=False).ids)

    return count_chat, f"tokenizer file {tok_file} with its chat template"


def _renderer(template: str, specials: dict[str, str]) -> Callable[[str], str]:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> Any:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        compiled = env.from_string(template)
    except TemplateError as e:
        raise InputError(f"endpoint.tokenizer: its chat_template does not compile: {e}") from None

    def render(text: str) -> str:
        messages = [{"role": "user", "content": text}]
        return compiled.render(messages=messages, add_generation_prompt=True, **specials)

    return render
