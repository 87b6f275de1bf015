"""The ``slimpack`` command line. One module per subcommand; ``main`` wires them together."""
