"""tfctl: one cluster file, four verbs, nothing left running.

Importing the package must stay cheap: no TensorFlow, no paramiko, no rich here.
"""

__version__ = "0.1.0"


def main() -> None:
    """The `tfctl` command. Ctrl-C while the command line loads exits quietly with 130, as it does
    at any later moment (`cli.app.main`), instead of printing a traceback from an import."""
    from tfctl.errors import EXIT_INTERRUPTED

    try:
        from tfctl.cli import main as run
    except KeyboardInterrupt:
        raise SystemExit(EXIT_INTERRUPTED) from None
    run()
