"""Write specs/data/digits_png: scikit-learn's digits as a Delta table of PNG images.

The table is committed; run this script only to rebuild it::

    python specs/data/make_digits_png.py           # refuses when the table exists
    python specs/data/make_digits_png.py --force   # delete it and write it again

Columns (1,797 rows, one Parquet file, version 0):

* ``image`` (binary): an 8 x 8 grayscale PNG of the digit. scikit-learn's pixels (0..16) are
  scaled to 0..255 as ``round(value * 255 / 16)``, so 16 is 255 and the image shows the digit
  as it is, without resampling.
* ``label`` (int64): the digit, 0..9.
* ``id`` (int64): the row's position in ``sklearn.datasets.load_digits()``.

The PNG bytes are the same on every run: Pillow's writer with fixed settings (compression
level 9, no optimisation pass) and no time or text chunks. They depend on the zlib that
Pillow was built with; the pixels never do. The Delta log holds the write's time, and the
Parquet file a random name, so only those differ from one rebuild to the next.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "digits_png"


def digit_pixels():
    """The 1,797 digits as uint8 images (n, 8, 8) on 0..255, and their labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.rint(digits.images * (255 / 16)).astype(np.uint8)
    return pixels, digits.target.astype(np.int64)


def encode_png(pixels) -> bytes:
    """One grayscale image (h, w) of uint8 as PNG bytes, the same bytes for the same pixels."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=9, optimize=False)
    return buffer.getvalue()


def digits_table():
    """The table's rows as a pyarrow Table: image (binary), label (int64), id (int64)."""
    import pyarrow as pa

    pixels, labels = digit_pixels()
    return pa.table({
        "image": pa.array([encode_png(image) for image in pixels], type=pa.binary()),
        "label": pa.array(labels, type=pa.int64()),
        "id": pa.array(range(len(labels)), type=pa.int64()),
    })


def write_table(path: Path) -> None:
    """Write the table to ``path`` (which must not exist) as one Parquet file, version 0."""
    from deltalake import write_deltalake

    write_deltalake(str(path), digits_table(), mode="error")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true",
                        help="delete an existing table and write it again")
    parser.add_argument("--output", type=Path, default=TABLE,
                        help=f"where to write the table (default: {TABLE})")
    args = parser.parse_args(argv)
    if args.output.exists():
        if not args.force:
            print(f"{args.output} exists; rerun with --force to delete it and write it again",
                  file=sys.stderr)
            return 1
        shutil.rmtree(args.output)
    write_table(args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
