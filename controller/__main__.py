"""`python -m controller`: the controller command without the CLI root
(the container's entry point and the tests' subprocess)."""

from toolkit import cli_cluster

cli_cluster.controller_cmd(prog_name="toolkit controller")
