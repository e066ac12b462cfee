#!/usr/bin/env python3
"""Exports the held-back Fashion-MNIST test images of the inpainting quality experiment.

Rule: the first N images (default 2) of each class, in file order, of the t10k (test) split,
which the flux1-fmnist model never saw in training. Writes 8-bit grayscale PNGs named
c<label>_<name>_<t10k index>.png into OUT and prints the indices. Python 3 standard library only.

  python3 bench/paper/data/export_fmnist_test.py \\
      --dataset-dir /usr/share/datasets/fashion-mnist --per-class 2 --out bench/paper/data/fmnist_test
"""
import argparse
import gzip
import os
import struct
import zlib

NAMES = ["tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
         "ankle_boot"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        size = rows * cols
        return [data[16 + i * size:16 + (i + 1) * size] for i in range(n)], rows, cols
    if magic == 2049:
        return list(data[8:8 + n]), 0, 0
    raise ValueError(f"{path}: not an IDX file (magic {magic})")


def write_gray_png(path, pixels, width, height):
    """8-bit grayscale PNG, no interlace, filter 0 on every row."""
    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body +
                struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + bytes(pixels[y * width:(y + 1) * width]) for y in range(height))
    png = (b"\x89PNG\r\n\x1a\n" +
           chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) +
           chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(png)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--per-class", type=int, default=2)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "fmnist_test"))
    a = p.parse_args()
    images, rows, cols = read_idx(os.path.join(a.dataset_dir, "t10k-images-idx3-ubyte.gz"))
    labels, _, _ = read_idx(os.path.join(a.dataset_dir, "t10k-labels-idx1-ubyte.gz"))
    os.makedirs(a.out, exist_ok=True)
    taken = {c: [] for c in range(10)}
    for i, label in enumerate(labels):
        if len(taken[label]) < a.per_class:
            taken[label].append(i)
    for c in range(10):
        for i in taken[c]:
            name = f"c{c}_{NAMES[c]}_{i:05d}.png"
            write_gray_png(os.path.join(a.out, name), images[i], cols, rows)
            print(f"{name}: t10k index {i}, label {c} ({NAMES[c]})")


if __name__ == "__main__":
    main()
