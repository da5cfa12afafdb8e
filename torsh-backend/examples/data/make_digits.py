#!/usr/bin/env python3
"""Writes digits.csv, the scikit-learn "digits" data set, for the lenet_digits example.

    python3 make_digits.py            # needs scikit-learn (pip install scikit-learn)

1,797 images of 8 x 8 pixels, each pixel an integer 0..16, and their class 0..9. One line per
image, in the data set's order: the class, then the 64 pixels row by row, comma-separated.
"""

from pathlib import Path

from sklearn.datasets import load_digits


def main() -> None:
    digits = load_digits()
    lines = []
    for label, pixels in zip(digits.target, digits.data):
        values = [int(label)] + [int(p) for p in pixels]
        lines.append(",".join(str(v) for v in values))
    out = Path(__file__).with_name("digits.csv")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} images to {out}")


if __name__ == "__main__":
    main()
