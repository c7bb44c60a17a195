"""One module per `kvbench` command; cli.py only wires them to the command line."""
