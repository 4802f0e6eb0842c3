"""`python -m controller`: the controller's command without the toolkit's
CLI root (the container's entry point and the tests' subprocess)."""

from controller import cli

cli.controller_cmd(prog_name="toolkit controller")
