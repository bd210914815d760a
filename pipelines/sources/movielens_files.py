"""MovieLens files (ml-100k, ml-1m): which layout a folder holds, and its parsers.

The layout is detected from the files: ``u.data`` means ml-100k (with
``u.user`` and ``u.item``), ``ratings.dat`` means ml-1m (with ``users.dat``
and ``movies.dat``); ``u.data`` is looked for first. The parsers return the
files' columns as they are; what they mean for the project's events and
dimension tables is :mod:`pipelines.sources.movielens`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

LAYOUT_100K: Final = "ml-100k"


LAYOUT_1M: Final = "ml-1m"


# Files each layout needs; the first one is what detection looks for.
LAYOUT_FILES: Final[Mapping[str, tuple[str, str, str]]] = {
    LAYOUT_100K: ("u.data", "u.user", "u.item"),
    LAYOUT_1M: ("ratings.dat", "users.dat", "movies.dat"),
}


GENRES: Final = (
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
"""MovieLens genres in ``u.genre`` order; a genre's index is its advertiser_id."""


class LayoutError(ValueError):
    """The source directory is not a MovieLens layout this module reads."""


@dataclass(frozen=True)
class Ratings:
    """The ratings, as parallel int64 arrays (time in epoch seconds)."""

    user_id: np.ndarray
    movie_id: np.ndarray
    rating: np.ndarray
    time_s: np.ndarray


def detect_layout(source: Path) -> str:
    """The layout of ``source``: :data:`LAYOUT_100K` or :data:`LAYOUT_1M`.

    Raises:
        LayoutError: ``source`` is not a directory, holds neither ``u.data``
            nor ``ratings.dat``, or lacks a companion file of its layout.
    """
    if not source.is_dir():
        raise LayoutError(f"MovieLens source {source} is not a directory")
    for layout, files in LAYOUT_FILES.items():
        if (source / files[0]).is_file():
            missing = [name for name in files[1:] if not (source / name).is_file()]
            if missing:
                raise LayoutError(
                    f"{source} looks like {layout} ({files[0]} present) but lacks "
                    + ", ".join(missing)
                )
            return layout
    looked_for = " or ".join(
        f"'{files[0]}' ({layout})" for layout, files in LAYOUT_FILES.items()
    )
    raise LayoutError(f"no MovieLens layout found in {source}: looked for {looked_for}")


def _read_table(path: Path, sep: str, *, dtype: Any = str) -> pd.DataFrame:
    """A headerless, unquoted, latin-1 text table split on ``sep`` (any length).

    Multi-character separators (ml-1m's ``::``) are rewritten to a tab first so
    the fast C parser can read the file.
    """
    raw = path.read_bytes()
    if len(sep) > 1:
        raw = raw.replace(sep.encode("latin-1"), b"\t")
        sep = "\t"
    return pd.read_csv(
        io.BytesIO(raw),
        sep=sep,
        header=None,
        encoding="latin-1",
        quoting=csv.QUOTE_NONE,
        dtype=dtype,
        keep_default_na=False,
        na_filter=dtype is not str,
        engine="c",
    )


def read_ratings(source: Path, layout: str) -> Ratings:
    """The ratings of either layout."""
    name = LAYOUT_FILES[layout][0]
    sep = "\t" if layout == LAYOUT_100K else "::"
    frame = _read_table(source / name, sep, dtype=np.int64)
    if frame.shape[1] != 4:
        raise ValueError(
            f"{source / name}: expected 4 columns (user, movie, rating, time), "
            f"got {frame.shape[1]}"
        )
    cols = [frame[i].to_numpy(np.int64) for i in range(4)]
    return Ratings(user_id=cols[0], movie_id=cols[1], rating=cols[2], time_s=cols[3])


def read_users(source: Path, layout: str) -> pd.DataFrame:
    """Columns user_id (int), age (int), gender (M/F), zip (str)."""
    if layout == LAYOUT_100K:
        frame = _read_table(source / "u.user", "|")
        id_col, age_col, gender_col, zip_col = 0, 1, 2, 4
    else:
        frame = _read_table(source / "users.dat", "::")
        id_col, gender_col, age_col, zip_col = 0, 1, 2, 4
    return pd.DataFrame(
        {
            "user_id": frame[id_col].astype(np.int64),
            "age": frame[age_col].astype(np.int64),
            "gender": frame[gender_col].str.strip(),
            "zip": frame[zip_col].str.strip(),
        }
    )


_TITLE_YEAR = r"\((\d{4})\)\s*$"


def read_movies(source: Path, layout: str) -> tuple[pd.DataFrame, list[str]]:
    """The movies and the genre names found that :data:`GENRES` does not know.

    Columns: movie_id (int), year (int, 0 when unknown), release_ms (float
    epoch milliseconds, NaN when unknown) and one 0/1 column per genre of
    :data:`GENRES`, in that order.
    """
    if layout == LAYOUT_100K:
        frame = _read_table(source / "u.item", "|")
        if frame.shape[1] != 5 + len(GENRES):
            raise ValueError(
                f"{source / 'u.item'}: expected {5 + len(GENRES)} columns, "
                f"got {frame.shape[1]}"
            )
        _check_genre_file(source / "u.genre")
        titles = frame[1]
        released = pd.to_datetime(
            frame[2].str.strip(), format="%d-%b-%Y", errors="coerce", utc=True
        )
        flags = frame.iloc[:, 5:].astype(np.int8).to_numpy()
        unknown_names: list[str] = []
        title_year = pd.to_numeric(titles.str.extract(_TITLE_YEAR)[0])
        year = released.dt.year.fillna(title_year).fillna(0)
        release_ms = (released - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(
            milliseconds=1
        )
    else:
        frame = _read_table(source / "movies.dat", "::")
        titles = frame[1]
        dummies = frame[2].str.get_dummies(sep="|")
        unknown_names = sorted(set(dummies.columns) - set(GENRES))
        flags = dummies.reindex(columns=list(GENRES), fill_value=0).to_numpy(np.int8)
        flags[flags.sum(axis=1) == 0, 0] = 1  # no known genre -> "unknown"
        year = pd.to_numeric(titles.str.extract(_TITLE_YEAR)[0]).fillna(0)
        released = pd.to_datetime(
            year.where(year > 0).astype("Int64").astype(str) + "-01-01",
            format="%Y-%m-%d",
            errors="coerce",
            utc=True,
        )
        release_ms = (released - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(
            milliseconds=1
        )
    movies = pd.DataFrame(
        {
            "movie_id": frame[0].astype(np.int64),
            "year": year.astype(np.int64),
            "release_ms": release_ms.astype(np.float64),
        }
    )
    genre_cols = pd.DataFrame(flags, columns=list(GENRES), index=movies.index)
    return pd.concat([movies, genre_cols], axis=1), unknown_names


def _check_genre_file(path: Path) -> None:
    """Fail loudly if a present ``u.genre`` disagrees with :data:`GENRES`."""
    if not path.is_file():
        return
    rows = [
        line.split("|")
        for line in path.read_text(encoding="latin-1").splitlines()
        if line.strip()
    ]
    found = tuple(name for name, _ in sorted(rows, key=lambda r: int(r[1])))
    if found != GENRES:
        raise ValueError(f"{path} lists genres {found}, expected {GENRES}")
