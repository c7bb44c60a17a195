"""`[endpoint] tokenizer`: prompt lengths from a Hugging Face tokenizer file and its chat template,
for servers with no /tokenize. The file is made here (no hub): a tokenizer that counts as the
emulator does (words and punctuation marks) and the emulator's chat template in Jinja, so that a
run against the emulator shows the lengths come out exact."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.core.errors import InputError
from harness.emulator import tokenizer as emulator_tokenizer
from harness.inputs import hf_tokenizer
from harness.results import read_requests, read_run
from tests.conftest import arm_folders, cli, kvbench, write_scenario

tokenizers = pytest.importorskip("tokenizers")

# the emulator's template (harness/emulator/tokenizer.py render_chat), as a model ships it
TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}<|start|>assistant{% endif %}"
)


def model_dir(folder: Path, template: str | None = TEMPLATE) -> Path:
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex(r"\w+|[^\w\s]"), behavior="removed", invert=True
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_chat_prompt_counts_as_the_server_renders_and_counts_it(tmp_path: Path) -> None:
    count, how = hf_tokenizer.counter(str(model_dir(tmp_path / "m")), "chat")
    assert "with its chat template" in how
    for text in ("", "hello, world", "[000000000001] alpha beta, gamma. " * 50):
        want = emulator_tokenizer.count(emulator_tokenizer.render_chat([{"role": "user", "content": text}]))
        assert asyncio.run(count(text)) == want
    plain, how = hf_tokenizer.counter(str(tmp_path / "m" / "tokenizer.json"), "completions")
    assert asyncio.run(plain("hello, world")) == 3 and "prompt as sent" in how


def test_a_chat_template_saved_beside_the_config_is_read(tmp_path: Path) -> None:
    """transformers (since 4.43) saves the template as chat_template.jinja, not in the config."""
    folder = model_dir(tmp_path / "m", template=None)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    count, how = hf_tokenizer.counter(str(folder), "chat")
    want = emulator_tokenizer.count(emulator_tokenizer.render_chat([{"role": "user", "content": "hello, world"}]))
    assert asyncio.run(count("hello, world")) == want and "with its chat template" in how


def test_bad_tokenizer_paths_and_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no tokenizer\.json at"):
        hf_tokenizer.counter(str(tmp_path / "none"), "chat")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="not a tokenizer file"):
        hf_tokenizer.counter(str(bad), "chat")
    with pytest.raises(InputError, match="no chat_template"):
        hf_tokenizer.counter(str(model_dir(tmp_path / "plain", template=None)), "chat")
    with pytest.raises(InputError, match="does not compile"):
        hf_tokenizer.counter(str(model_dir(tmp_path / "broken", template="{% for %}")), "chat")


def test_a_run_sized_by_the_tokenizer_file_gets_exact_lengths(tmp_path: Path) -> None:
    folder = model_dir(tmp_path / "m")
    sc = write_scenario(
        tmp_path / "s.toml",
        f'name = "tok"\n[endpoint]\ntokenizer = "{folder}"\n[workload]\nkind = "sweep"\n'
        "lengths = [300, 2000]\nrepetitions = 1\n[emulator]\ntime_scale = 50.0\n",
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (run,) = arm_folders(tmp_path / "out", "tok").values()
    assert "tokenizer file" in read_run(run).meta["prompt_counting"]
    recs = read_requests(run)
    assert recs and all(x.prompt_tokens == x.target_tokens for x in recs)  # as the server counted
    r = cli("validate", str(sc))
    assert r.returncode == 0
