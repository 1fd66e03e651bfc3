"""``io.*``: which data files each data loader reads (EPL's io slicing).

With ``io.slicing`` each of the ``replica_size`` data loaders reads its own files,
round robin (loader ``i`` takes files ``i, i + n, i + 2n, ...``); without it every
loader reads every file. When the files do not divide evenly:

- ``io.drop_last_files``: the last ``len(files) % n`` files are dropped, every loader
  reads the same number of files;
- ``io.unbalanced_io_slicing``: the first ``len(files) % n`` loaders read one more file;
- neither: an error (EPL's default is balanced slicing).

Fewer files than loaders is always an error under slicing (a loader would read nothing).

These keys act only through :func:`slice_files` / :class:`FileListDataset`, called by
the data loader's script: EPL slices the files of its own dataset ops, Pyrsia's data
loaders read files themselves. So a key that nothing reads is reported: a ``TrainCtx``
whose config sets ``io.*`` warns at construction that the NN worker does not read them,
and a process whose ``persia.epl.init`` set them but never called ``slice_files`` warns
at exit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from persia.epl.config import Config
from persia.epl.state import current_config, note_io_read
from pyrsia.shared.errors import ConfigError, InvalidInputError


def slice_files(
    files: Sequence[str],
    replica_index: int | None = None,
    replica_size: int | None = None,
    config: Config | None = None,
) -> list[str]:
    """The files data loader ``replica_index`` of ``replica_size`` reads under ``config``.

    ``replica_index`` / ``replica_size`` default to this data loader's
    (``persia.env.get_replica_index/size``); ``config`` to the one given to ``epl.init``.
    """
    if isinstance(files, (str, bytes)) or not isinstance(files, Sequence):
        raise InvalidInputError("files", "a list of file paths", files)
    if replica_index is None or replica_size is None:
        from persia import env

        replica_index = env.get_replica_index() if replica_index is None else replica_index
        replica_size = env.get_replica_size() if replica_size is None else replica_size
    if isinstance(replica_size, bool) or not isinstance(replica_size, int) or replica_size < 1:
        raise InvalidInputError("replica_size", "an integer >= 1", replica_size)
    if (
        isinstance(replica_index, bool)
        or not isinstance(replica_index, int)
        or not 0 <= replica_index < replica_size
    ):
        raise InvalidInputError(
            "replica_index", f"an integer in [0, {replica_size})", replica_index
        )
    config = config or current_config() or Config()
    note_io_read()
    files = list(files)
    if not config.io.slicing:
        return files
    n_files, remainder = len(files), len(files) % replica_size
    if n_files < replica_size:
        raise ConfigError(
            f"io.slicing: {n_files} files cannot be sliced over {replica_size} data loaders "
            "(each needs at least one file)"
        )
    if remainder:
        if config.io.drop_last_files:
            files = files[: n_files - remainder]
        elif not config.io.unbalanced_io_slicing:
            raise ConfigError(
                f"io.slicing: {n_files} files do not divide evenly over {replica_size} data "
                'loaders: set "io.drop_last_files" (drop the last '
                f'{remainder}) or "io.unbalanced_io_slicing" (some loaders read one more)'
            )
    return files[replica_index::replica_size]


class FileListDataset:
    """Iterates ``read(path)`` over this data loader's slice of ``files``.

    ``read`` yields whatever the data loader sends (``PersiaBatch`` es, rows, ...).
    """

    def __init__(
        self,
        files: Sequence[str],
        read: Callable[[str], Iterable[Any]],
        replica_index: int | None = None,
        replica_size: int | None = None,
        config: Config | None = None,
    ):
        if not callable(read):
            raise InvalidInputError("read", "a function path -> iterable of items", read)
        self.files = slice_files(files, replica_index, replica_size, config)
        self.read = read

    def __iter__(self) -> Iterator[Any]:
        for path in self.files:
            yield from self.read(path)

    def __len__(self) -> int:
        return len(self.files)
