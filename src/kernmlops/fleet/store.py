"""Where a dataset lives: a URI opened as a pyarrow filesystem, and what goes wrong there
said in one line.

pyarrow opens ``file://``, ``s3://``, ``gs://``, ``abfs://`` and ``hdfs://`` itself; any
other scheme goes through fsspec where fsspec and the scheme's driver are installed
(``memory://``, ``sftp://``, ...). Credentials come from where each client looks: for S3
the AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and
``~/.aws``, instance roles) and ``AWS_ENDPOINT_URL`` for a server other than AWS (MinIO,
Ceph); for GCS and Azure their SDKs' defaults. A URI is shown without its user
information or secret query values, and errors are reduced to the service's own reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kernmlops.errors import OutputError, why_not_written

if TYPE_CHECKING:
    import pyarrow.fs as pafs

__all__ = [
    "OBJECT_STORES",
    "Dataset",
    "PublishError",
    "Unreadable",
    "delete",
    "describe_error",
    "listing",
    "open_dataset",
    "open_source",
    "probe",
    "put",
    "read_at_most",
]

#: filesystems whose writes appear whole when the upload completes (no rename needed:
#: a rename there is a copy)
OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})

_SECRET_KEYS = re.compile(r"key|secret|token|password|credential|sig", re.IGNORECASE)
_AWS_ERROR = re.compile(r"AWS Error (\w+) during (\w+) operation: ([^(]*)")


class PublishError(OutputError):
    """The dataset cannot be opened or written, or a collection cannot be published."""


class Unreadable(ValueError):
    """A file of the dataset that :func:`read_at_most` refuses for what it is (too
    large, not a plain file): damage, not a failure of the filesystem. The message
    says why ("over the 16.0 MiB limit")."""


def redact(uri: str) -> str:
    """``uri`` without user information and with secret query values hidden."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<an unparsable URI>"
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    query = urlencode(
        [(k, "***" if _SECRET_KEYS.search(k) else v) for k, v in parse_qsl(parts.query)],
        safe="*/:",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _secrets() -> list[str]:
    """Values that must never reach a message (an SDK may echo what it was given)."""
    names = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY")
    return [v for v in (os.environ.get(n) for n in names) if v and len(v) >= 4]


def describe_error(err: BaseException) -> str:
    """The reason in ``err``, short: an S3 error's code and message (no request id), an
    OSError's text; never a secret from the environment."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    aws = _AWS_ERROR.search(str(err))
    if aws:
        code, _, message = aws.groups()
        hint = {
            "NETWORK_CONNECTION": "no answer from the endpoint (is the server up? "
            "AWS_ENDPOINT_URL or ?endpoint_override= names it)",
            "ACCESS_DENIED": "access denied: check the credentials (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and the bucket's policy",
            "INVALID_ACCESS_KEY_ID": "the access key is not known to the server: check "
            "AWS_ACCESS_KEY_ID or AWS_PROFILE",
            "SIGNATURE_DOES_NOT_MATCH": "the secret key is wrong: check "
            "AWS_SECRET_ACCESS_KEY or AWS_PROFILE",
            "NO_SUCH_BUCKET": "the bucket does not exist: create it first",
        }.get(code)
        text = hint or f"{message.strip()} ({code})"
    elif isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        text = "the destination is full"
    elif isinstance(err, OSError) and err.errno in (errno.EACCES, errno.EPERM):
        text = "permission denied"
    elif isinstance(err, OSError) and err.errno == errno.EROFS:
        text = "the destination is read-only"
    elif isinstance(err, OSError) and err.errno == errno.ENOTDIR:
        text = "a part of the path is a file, not a folder"
    elif isinstance(err, OSError) and err.errno == errno.ENOENT and err.filename:
        # a folder that cannot be made where it was named (/proc), or one gone meanwhile
        text = why_not_written(err, Path(err.filename))
    elif isinstance(err, OSError) and err.strerror:
        text = err.strerror  # not "[Errno -2] ...: 'path'": the caller names the path
    for secret in _secrets():
        text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class Dataset:
    """A dataset's root: a pyarrow filesystem and the path of the root inside it."""

    fs: pafs.FileSystem
    #: the root inside ``fs``, without a trailing slash
    root: str
    #: the URI as it may be shown (no credentials)
    uri: str

    @property
    def kind(self) -> str:
        """The filesystem's name: ``local``, ``s3``, ``gcs``, ``abfs``, ``hdfs``, ``py``."""
        return str(self.fs.type_name)

    @property
    def local(self) -> bool:
        return self.kind == "local"

    def path(self, *parts: str) -> str:
        """The path of ``parts`` (relative, "/"-separated) under the root."""
        return "/".join([self.root, *parts]) if self.root else "/".join(parts)

    def where(self, *parts: str) -> str:
        """The URI of ``parts`` under the root, as it may be shown."""
        return "/".join([self.uri.rstrip("/"), *parts])


def open_dataset(uri: str | Path) -> Dataset:
    """Open the dataset root at ``uri`` (a URI, or a local path).

    Raises:
        PublishError: the URI is malformed, its scheme has no filesystem here, or the
            filesystem cannot be set up (its reason, one line).
    """
    import pyarrow as pa
    import pyarrow.fs as pafs

    text = str(uri)
    if not text.strip():
        # an empty URI would be the current directory: publish there by naming it (.)
        raise PublishError("the URI is empty: name a folder (. for this one) or scheme://...")
    if "://" not in text:
        path = Path(text).expanduser().absolute()
        return Dataset(pafs.LocalFileSystem(), str(path).rstrip("/") or "/", str(path))
    shown = redact(text)
    scheme = text.split("://", 1)[0].lower()
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme):
        raise PublishError(f"{shown}: not a URI (expected scheme://..., e.g. s3://bucket/prefix)")
    try:
        fs, root = pafs.FileSystem.from_uri(text)
    except pa.ArrowInvalid as err:
        if "nrecognized filesystem type" not in str(err):
            raise PublishError(f"{shown}: {describe_error(err)}") from None
        fs, root = _fsspec(text, scheme, shown)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise PublishError(f"cannot open {shown}: {describe_error(err)}") from None
    if scheme in ("s3", "gs", "gcs", "abfs", "abfss") and not root.strip("/"):
        raise PublishError(f"{shown}: name a bucket (and a prefix): {scheme}://BUCKET/PREFIX")
    return Dataset(fs, root.rstrip("/") or "/", shown.split("?", 1)[0])


def _fsspec(uri: str, scheme: str, shown: str) -> tuple[pafs.FileSystem, str]:
    """A scheme pyarrow lacks, through fsspec and its driver."""
    import pyarrow.fs as pafs

    try:
        import fsspec
    except ImportError:
        raise PublishError(
            f"{shown}: pyarrow has no filesystem for {scheme}:// (it opens file, s3, gs, "
            "abfs, hdfs); install fsspec and its driver for others"
        ) from None
    if scheme not in fsspec.available_protocols():
        raise PublishError(
            f"{shown}: no filesystem for {scheme}:// (pyarrow opens file, s3, gs, abfs, hdfs; "
            "fsspec knows no such protocol)"
        )
    try:
        fs, root = fsspec.core.url_to_fs(uri)
    except ImportError as err:  # fsspec says which package the scheme needs
        raise PublishError(f"{shown}: {describe_error(err)}") from None
    except (ValueError, OSError) as err:
        raise PublishError(f"cannot open {shown}: {describe_error(err)}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), root


def listing(dataset: Dataset, base: str, *, recursive: bool = False) -> list[pafs.FileInfo]:
    """What is under ``base`` (a full path in ``dataset.fs``; none when it is missing).
    In a local dataset, as root, nothing reached through a link below the root (pyarrow
    follows links to folders and files): a link a user put in a shared dataset would
    have root read, index and list what it leads to (another's collection, root's
    files) as the dataset's own.
    """
    import pyarrow.fs as pafs

    infos = dataset.fs.get_file_info(
        pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
    )
    if not dataset.local or os.geteuid() != 0:
        return infos
    root = dataset.root.rstrip("/")
    seen: dict[str, bool] = {}

    def linked(path: str) -> bool:
        if path in seen:
            return seen[path]
        parent = path.rpartition("/")[0]
        found = os.path.islink(path) or (len(parent) > len(root) and linked(parent))
        seen[path] = found
        return found

    return [i for i in infos if not (i.path.startswith(root + "/") and linked(i.path))]


def read_at_most(dataset: Dataset, path: str, limit: int) -> bytes:
    """The bytes of ``path`` (a full path in ``dataset.fs``), at most ``limit``. Whoever
    writes in a dataset can make a small file (a manifest, an index row) huge, even
    sparse, which read whole would take its size in memory, or put a FIFO at its name,
    which a local open would wait on for ever.

    Raises:
        Unreadable: the file holds more than ``limit`` bytes, or (local) is not a
            plain file.
        OSError: it cannot be read (FileNotFoundError: it is not there).
    """
    from kernmlops.confined import human_size

    if dataset.local:
        from kernmlops.host.pinned import open_regular

        try:
            fd = open_regular(Path(path))  # never blocks: a FIFO is refused
        except OSError as err:
            if err.errno == errno.EINVAL:
                raise Unreadable("not a plain file") from None
            raise
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    else:
        with dataset.fs.open_input_stream(path) as stream:
            data = bytes(stream.read(limit + 1))
    if len(data) > limit:
        raise Unreadable(f"over the {human_size(limit)} limit")
    return data


def probe(dataset: Dataset) -> None:
    """Check that the dataset can be reached before anything is copied (or collected):
    its root is listed, its bucket exists, a local root is there or can be made.

    A local root is not made here but by the first file written (:func:`put`): a push
    whose every collection is refused leaves no empty dataset folder behind.

    Raises:
        PublishError: the reason it cannot be reached (one line).
    """
    import pyarrow.fs as pafs

    try:
        if dataset.local:
            root = Path(dataset.root)
            # the nearest name that is there: the root, or the folder it would be made in
            there, missing = root, []
            while not os.path.lexists(there) and there != there.parent:
                missing.append(there)
                there = there.parent
            if not there.is_dir():
                if there == root:
                    raise PublishError(_a_file(dataset))
                raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(there))
            if not os.access(there, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "permission denied", str(there))
            _can_make(missing)
            return
        if dataset.kind in OBJECT_STORES:
            bucket = dataset.root.split("/", 1)[0]
            if dataset.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise PublishError(
                    f"{dataset.uri}: the bucket {bucket!r} does not exist: create it first"
                )
        if dataset.fs.get_file_info(dataset.root).type == pafs.FileType.File:
            raise PublishError(_a_file(dataset))
    except PublishError:
        raise
    except (OSError, ValueError) as err:
        raise PublishError(f"cannot reach {dataset.uri}: {describe_error(err)}") from None


def _can_make(missing: list[Path]) -> None:
    """Make the folders ``missing`` (the deepest first in the list) and take them away
    again: whether they can be made at all (root may write where nothing can be made,
    e.g. under /proc) is known before a push starts, and nothing is left behind."""
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _a_file(dataset: Dataset) -> str:
    return f"{dataset.uri} is a file, not a dataset: name a folder (or prefix) for the dataset"


#: a file being written where a rename makes it appear whole
TEMP_SUFFIX = ".push-tmp"
_CHUNK = 8 << 20


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _held_folder(dataset: Dataset, rel: str, *, create: bool) -> int:
    """The folder ``rel`` (relative, "/"-separated) under a local dataset's root, opened
    one name at a time without following a link (made where missing, with ``create``):
    a dataset folder is often one many users write in (a shared mount), and a link one
    of them put at a folder's name would lead root's writes and deletions elsewhere. The
    root itself is opened as it was named.

    Raises:
        PublishError: a name on the way is a link or a file.
        OSError: a folder is missing (without ``create``) or cannot be made or opened.
    """
    from kernmlops.host.pinned import UnsafePath, fd_path, subfolder

    if create:  # the root itself as named: made by the first file a push writes
        Path(dataset.root or "/").mkdir(parents=True, exist_ok=True)
    fd = os.open(dataset.root or "/", _DIR)
    try:
        for name in [p for p in rel.split("/") if p]:
            if name in (".", ".."):
                raise PublishError(f"{dataset.where(rel)}: {name!r} in a path: not written")
            try:
                inner = subfolder(fd_path(fd), name, create=create)
            except UnsafePath:
                raise PublishError(
                    f"{dataset.where(rel)}: {name} is a link or a file, not a folder: "
                    "nothing is written or deleted through it"
                ) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_source(source: Path) -> int:
    """A collection's file opened for copying: never through a link (one swapped in
    after the collection was checked), only a plain file and, as root, not a second
    name of a file of another owner than its folder's (a hard link to root's file).

    Raises:
        OSError: ELOOP for a link, EINVAL for what is not a plain file, EPERM for a
            hard link to another's file.
    """
    from kernmlops.host.pinned import open_plain_file

    return open_plain_file(source, owner=os.stat(source.parent).st_uid)


def _put_local(source: Path | bytes, dataset: Dataset, rel: str) -> None:
    """Write to a hidden temporary name, sync, rename, sync the folder: a crash of the
    machine leaves the old file or the new one. The folders are walked and held
    (:func:`_held_folder`), the temporary file made new, never through a link."""
    from kernmlops.host.pinned import create_new, fd_path

    head, _, name = rel.rpartition("/")
    folder = _held_folder(dataset, head, create=True)
    tmp = f".{name}{TEMP_SUFFIX}"
    try:
        try:
            # a leftover, or a planted link, at its name: only the name goes
            with open(create_new(fd_path(folder) / tmp), "wb") as out:
                if isinstance(source, bytes):
                    out.write(source)
                else:
                    with open(open_source(source), "rb") as src:
                        shutil.copyfileobj(src, out, _CHUNK)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        os.fsync(folder)
    finally:
        os.close(folder)


def delete(dataset: Dataset, rel: str) -> None:
    """Delete the file ``rel`` under the root; in a local dataset through its folders
    held (:func:`_held_folder`): a link at a folder's name is not followed.

    Raises:
        FileNotFoundError: there is no such file.
        PublishError: a folder on the way is a link (local).
    """
    if not dataset.local:
        dataset.fs.delete_file(dataset.path(rel))
        return
    head, _, name = rel.rpartition("/")
    folder = _held_folder(dataset, head, create=False)
    try:
        os.unlink(name, dir_fd=folder)
    finally:
        os.close(folder)


def put(dataset: Dataset, source: Path | bytes, rel: str) -> None:
    """Copy ``source`` (a file, or bytes) to ``rel`` under the root, appearing whole."""
    target = dataset.path(rel)
    if dataset.local:
        _put_local(source, dataset, rel)
        return
    direct = dataset.kind in OBJECT_STORES
    head, _, name = target.rpartition("/")
    write_to = target if direct else f"{head}/.{name}{TEMP_SUFFIX}"
    if not direct:
        dataset.fs.create_dir(head, recursive=True)
    try:
        with dataset.fs.open_output_stream(write_to) as out:
            if isinstance(source, bytes):
                out.write(source)
            else:
                with open(open_source(source), "rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
        if not direct:
            dataset.fs.move(write_to, target)
    except BaseException:
        if not direct:
            with contextlib.suppress(OSError):
                dataset.fs.delete_file(write_to)
        raise
