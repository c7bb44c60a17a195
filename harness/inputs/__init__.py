"""What is sent: prompts built to exact lengths, request traces, tokenizer files."""
