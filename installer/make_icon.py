"""Draw the Longlens icon (a lens over lines of text: a photo found by a paragraph) with Pillow.

Writes installer/icons/longlens.png (512 px), longlens.ico (Windows, 16-256 px) and
longlens.icns (macOS). The files are committed; run this again only to change the design:
    .venv/bin/python installer/make_icon.py
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent / "icons"
SIZE = 1024  # drawn large, scaled down with antialiasing


def draw() -> Image.Image:
    s = SIZE
    img = Image.new("RGBA", (s, s), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    # Rounded tile: deep blue.
    d.rounded_rectangle((40, 40, s - 40, s - 40), radius=200, fill=(28, 58, 110, 255))
    # Lines of a paragraph.
    for i, width in enumerate((0.70, 0.62, 0.74, 0.48)):
        y = 230 + i * 120
        d.rounded_rectangle((150, y, 150 + int(width * (s - 300)), y + 52), radius=26,
                            fill=(215, 226, 245, 255))
    # The lens: ring, glass and handle.
    cx, cy, r = 610, 600, 215
    d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=(255, 196, 61, 90))
    d.ellipse((cx - r, cy - r, cx + r, cy + r), outline=(255, 196, 61, 255), width=56)
    d.line((cx + 150, cy + 150, cx + 300, cy + 300), fill=(255, 196, 61, 255), width=96)
    return img


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    big = draw()
    big.resize((512, 512), Image.LANCZOS).save(HERE / "longlens.png", optimize=True)
    big.resize((256, 256), Image.LANCZOS).save(
        HERE / "longlens.ico", sizes=[(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (128, 128), (256, 256)]
    )
    big.resize((512, 512), Image.LANCZOS).save(HERE / "longlens.icns")
    print(f"wrote icons into {HERE}")


if __name__ == "__main__":
    main()
