"""The run watched as it goes: the progress display and the client's own health."""
