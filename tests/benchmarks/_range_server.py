"""An HTTP server of a local folder that reads only the byte range asked (``rangehttpserver``), with a strong ETag per
file (its inode, size and mtime) and ``If-Match`` honoured (412 when it names another version): benchmark 17's
stand-in for a bucket where moto's cost would be measured instead of ours (moto reads a whole object to answer each
ranged GET: a 24 MB object costs a 24 MB read per 64 KiB range).

``python -m tests.benchmarks._range_server PORT FOLDER`` prints ``ready`` once it listens.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from http.server import ThreadingHTTPServer

from RangeHTTPServer import RangeRequestHandler


class _Handler(RangeRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _etag(self) -> str | None:
        try:
            st = os.stat(self.translate_path(self.path))
        except OSError:
            return None
        return f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'

    def send_head(self):
        etag = self._etag()
        wanted = self.headers.get("If-Match")
        if etag is not None and wanted is not None and wanted != etag:
            self.send_error(412, "Precondition Failed")
            return None
        self._tag = etag
        return super().send_head()

    def end_headers(self) -> None:
        if getattr(self, "_tag", None):
            self.send_header("ETag", self._tag)
            self._tag = None
        super().end_headers()


def main(port: int, folder: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), partial(_Handler, directory=folder))
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
