"""Write the digits split of examples/digits as ``digits-train.npz`` / ``digits-eval.npz``
(``x`` float32 [N, 64] in [0, 1], ``y`` int64 [N]) for examples/digits_pt, from the
``digits.npz`` shipped beside it. No TensorFlow, no scikit-learn (a ``pip install -e '.[pt]'``
runs it)::

    .venv/bin/python examples/digits_pt/prepare_data.py --out-dir /shared/digits_pt
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(HERE / "data"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from data import _split

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    x_tr, y_tr, x_ev, y_ev = _split()
    np.savez(out / "digits-train.npz", x=x_tr, y=y_tr)
    np.savez(out / "digits-eval.npz", x=x_ev, y=y_ev)
    print(f"wrote {len(y_tr)} training and {len(y_ev)} eval examples to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
