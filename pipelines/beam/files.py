"""Where a Beam job's files are, on any filesystem Beam knows, and the
dimension tables both jobs read.

``--input`` and ``--output`` may be a local folder or a URL of any scheme
Beam's filesystems serve (GCS, S3, HDFS...): :func:`input_location` and
:func:`output_location` name them as the jobs do, and a scheme no installed
filesystem serves is a one-line error. :func:`read_dimension` reads the
``users`` / ``ads`` / ``contents`` tables in their contract schemas, for the
batch job's side inputs and the streaming job's state alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from features.dimensions import AD_SCHEMA, CONTENT_SCHEMA, USER_SCHEMA
from pipelines.core.event_files import (
    InputFileError,
)


def output_location(path: str) -> str:
    """``--output`` as the job names it: a URL as given (without a trailing
    slash), a local path absolute and normalized."""
    if FileSystems.get_scheme(path) is None:
        return str(Path(path).resolve())
    return _served(path).rstrip("/")


def input_location(path: str) -> str:
    """``--input`` as the job names its files: a URL as given (without a
    trailing slash), a local path as ``pathlib`` spells it, which is how
    :func:`pipelines.core.event_files.event_files` (the reference's) names them."""
    if FileSystems.get_scheme(path) is None:
        return str(Path(path))
    return _served(path).rstrip("/")


def _served(url: str) -> str:
    """``url``, once a Beam filesystem is known to serve its scheme."""
    try:
        FileSystems.get_filesystem(url)
    except ValueError:
        scheme = FileSystems.get_scheme(url)
        raise InputFileError(
            f"{url}: no Beam filesystem serves {scheme}://",
            "install the Beam extra that provides it (apache-beam[gcp] for "
            "gs://, apache-beam[aws] for s3://)",
        ) from None
    return url


def dimension_path(input_dir: str, name: str) -> str:
    """Where the dimension table ``name`` (users, ads, contents) is."""
    return FileSystems.join(input_location(input_dir), f"{name}.parquet")


def read_dimension(path: str, schema: pa.Schema) -> pa.Table:
    """A dimension table in exactly ``schema`` (empty when the file is absent)."""
    if not FileSystems.exists(path):
        return schema.empty_table()
    try:
        with FileSystems.open(path) as handle:
            table = pq.read_table(handle, columns=schema.names)
    except (OSError, pa.ArrowException) as error:
        raise InputFileError(f"{path}: cannot read ({error})") from error
    return table.cast(schema).combine_chunks()


DIMENSION_SCHEMAS: Final = {
    "users": USER_SCHEMA,
    "ads": AD_SCHEMA,
    "contents": CONTENT_SCHEMA,
}
