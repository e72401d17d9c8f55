"""How an OSError is told to an operator: the reason with the errno's name (`No space left on
device (ENOSPC)`), and the file(s) it concerns when the error names them.

The errno's name is what an operator searches the kernel log and the manuals for; a write's
own OSError names no file, so callers that know it say it themselves. Shared by the WAL, the
node's own files, the GC's deletions and the CLI, so every storage message reads alike.
"""

from __future__ import annotations

import errno


def errno_text(exc: OSError) -> str:
    """`No space left on device (ENOSPC)`: the reason and, if known, the errno's name."""
    text = exc.strerror or str(exc)
    name = errno.errorcode.get(exc.errno) if exc.errno is not None else None
    return f"{text} ({name})" if name else text


def os_error_text(exc: OSError) -> str:
    """`/ms/node-1/node.pid: No space left on device (ENOSPC)`: the file(s) the error names,
    then `errno_text`."""
    files = ", ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    return f"{files}: {errno_text(exc)}" if files else errno_text(exc)


__all__ = ["errno_text", "os_error_text"]
