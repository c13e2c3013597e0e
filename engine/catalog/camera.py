"""A camera as photo tools show it: one name made of the EXIF Make and Model, the maker written
once ("NIKON D750", not "NIKON CORPORATION NIKON D750").

How the tools do it: digiKam shortens the maker by removing company suffixes (" CORPORATION",
" OPTICAL CO.,LTD", "EASTMAN ", ...: ItemPropertiesTab::shortenedMakeInfo) and drops the maker's
name from the model; darktable looks the pair up in rawspeed's camera list (RAW cameras only) and
otherwise passes both through (dt_rawspeed_lookup_makermodel). Here, without a camera list: the
maker is shortened as digiKam does, then the model is shown alone when it already names the maker
(as the model of a Nikon, Canon, Pentax, Kodak, Olympus or Leica does), else the maker comes first
("SONY ILCE-7M3"). Letters are kept as written: the name reads as the camera wrote it.
"""

from __future__ import annotations

import re

# Company words at the end of an EXIF Make (digiKam's list, generalised to any order of
# punctuation: "OLYMPUS IMAGING CORP.", "OLYMPUS OPTICAL CO.,LTD", "Minolta Co., Ltd.",
# "SAMSUNG TECHWIN CO., LTD.", "SANYO Electric Co.,Ltd.", "CASIO COMPUTER CO.,LTD.",
# "RICOH IMAGING COMPANY, LTD.", "Hewlett-Packard Company", "Eastman Kodak Company").
_COMPANY_TAIL = re.compile(
    r"(?:[\s,.]+(?:corporation|corp|company|co|ltd|inc|gmbh|ag|optical|imaging|electric|computer|techwin"
    r"|camera|digital|photo|industries|industry|manufacturing|mfg|international|intl|limited))+[\s,.]*$",
    re.IGNORECASE,
)
CAMERA_DISPLAY = "longlens_camera"  # camera_display as an SQL function (engine.catalog.db registers it)
_COMPANY_HEAD = re.compile(r"^eastman\s+", re.IGNORECASE)  # "EASTMAN KODAK COMPANY" -> "KODAK"


def short_make(make: str | None) -> str:
    """The maker's name without company words: "NIKON CORPORATION" -> "NIKON",
    "OLYMPUS IMAGING CORP." -> "OLYMPUS", "EASTMAN KODAK COMPANY" -> "KODAK"; "" for none."""
    text = " ".join((make or "").split())
    shorter = _COMPANY_HEAD.sub("", _COMPANY_TAIL.sub("", text)).strip(" ,.")
    return shorter or text


def _names_maker(model: str, maker: str) -> bool:
    """The model already starts with the maker's name (or its first word), case ignored:
    "NIKON D750" for NIKON, "Canon EOS 5D Mark IV" for Canon, "KODAK DC4800 ZOOM" for KODAK."""
    m = model.casefold()
    for name in {maker.casefold(), maker.split(" ")[0].casefold()}:
        if name and (m == name or (m.startswith(name) and not m[len(name)].isalnum())):
            return True
    return False


def camera_display(make: object, model: object) -> str | None:
    """The camera's name as photo tools show it: "NIKON CORPORATION" + "NIKON D750" ->
    "NIKON D750"; "Canon" + "Canon EOS 5D Mark IV" -> "Canon EOS 5D Mark IV"; "SONY" +
    "ILCE-7M3" -> "SONY ILCE-7M3"; only a make or only a model: that one. None when neither is
    known (empty or blank)."""
    model_text = " ".join(model.split()) if isinstance(model, str) else ""
    maker = short_make(make if isinstance(make, str) else None)
    if not model_text:
        return maker or None
    if not maker or _names_maker(model_text, maker):
        return model_text
    return f"{maker} {model_text}"
