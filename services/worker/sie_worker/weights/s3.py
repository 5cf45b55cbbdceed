"""`s3://bucket/prefix` locations read and written through boto3.

Credentials come from the usual AWS sources (environment, profile, instance
role); SIE_S3_ENDPOINT_URL points the client at an S3-compatible server
(MinIO, a loopback test server) instead of AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3


def is_s3_url(location: str | None) -> bool:
    return location is not None and location.startswith("s3://")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing '/'; may be empty

    @classmethod
    def parse(cls, url: str) -> S3Location:
        if not is_s3_url(url):
            raise ValueError(f"{url!r} is not an s3:// URL")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"{url!r} names no bucket")
        return cls(bucket, prefix.strip("/"))

    def child(self, relative: str) -> S3Location:
        return S3Location(self.bucket, "/".join(part for part in (self.prefix, relative.strip("/")) if part))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


class S3Store:
    """The few object operations the worker needs."""

    def __init__(self, endpoint_url: str | None) -> None:
        self._client: Any = boto3.client("s3", endpoint_url=endpoint_url or None)

    def keys(self, location: S3Location) -> list[str]:
        """Every key under the location's prefix (as a folder), sorted."""
        prefix = location.prefix + "/" if location.prefix else ""
        keys: list[str] = []
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(keys)

    def exists(self, location: S3Location) -> bool:
        try:
            self._client.head_object(Bucket=location.bucket, Key=location.prefix)
        except self._client.exceptions.ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise
        return True

    def read_text(self, bucket: str, key: str) -> str:
        return self._client.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")

    def write_bytes(self, location: S3Location, data: bytes) -> None:
        self._client.put_object(Bucket=location.bucket, Key=location.prefix, Body=data)

    def download_folder(self, location: S3Location, destination: Path) -> None:
        """Copy every object under the prefix into `destination`, keeping relative paths."""
        prefix = location.prefix + "/" if location.prefix else ""
        for key in self.keys(location):
            relative = key[len(prefix) :]
            if not relative or relative.endswith("/"):
                continue
            target = destination / relative
            if destination.resolve() not in target.resolve().parents:
                raise ValueError(f"s3://{location.bucket}/{key} would be written outside {destination}")
            target.parent.mkdir(parents=True, exist_ok=True)
            self._client.download_file(location.bucket, key, str(target))

    def upload_folder(self, source: Path, location: S3Location, *, skip: frozenset[str] = frozenset()) -> None:
        """Copy every file under `source` to the prefix, keeping relative paths."""
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source).as_posix()
            if path.is_file() and relative not in skip:
                self._client.upload_file(str(path), location.bucket, location.child(relative).prefix)
