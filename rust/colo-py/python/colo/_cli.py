"""The ``colo`` command of the wheel: executes the ``colo`` binary shipped inside the package.

The binary carries its LD_PRELOAD shim (``colo run`` writes it to a per-user cache directory), so
nothing else is needed on disk. ``make wheel`` puts it in ``colo/_bin/colo`` before maturin packs
the wheel; a package built without it (``pip install rust/colo-py``) says so.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "colo")
    if not os.path.isfile(exe):
        sys.exit("colo: this package was built without the colo command (build the wheel with `make wheel`)")
    # execv keeps our pid: signals, job control and the exit status are the binary's.
    os.execv(exe, ["colo", *sys.argv[1:]])


if __name__ == "__main__":
    main()
