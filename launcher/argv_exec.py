"""Exec an argv given as one JSON string: ``python -m launcher.argv_exec '["cmd", ":"]'``.

srun reads a lone ``:`` anywhere on its command line as a het-component separator
(checked with Slurm 22.05), so a user command that contains a lone ``:`` argument is
passed through this shim, byte for byte, instead of directly.
"""
import json
import os
import sys

from csrun_common.exits import EXEC_FAILED


def main() -> None:
    """Exec ``json.loads(sys.argv[1])``; exit 127 when the program cannot be executed."""
    argv = json.loads(sys.argv[1])
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"csrun: cannot execute {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        os._exit(EXEC_FAILED)


if __name__ == "__main__":
    main()
