"""gcp-storage-emulator, answering downloads as GCS does: with the object's generation.

GCS sends ``x-goog-generation`` with every object it returns, and TensorStore (Orbax's array
storage) reads it to know which version it holds before it rewrites a file, such as an OCDBT
manifest; the emulator leaves it out, and TensorStore then fails now and then with "Malformed
StorageGeneration". This adds the header and changes nothing else. Run it with the emulator's
own arguments: ``python gcs_emulator.py start --host 127.0.0.1 --port N --in-memory``.
"""

from __future__ import annotations

import sys
from http import HTTPStatus

from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    _download(request, response, storage, *args, **kwargs)
    if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        found = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(found.get("generation") or 1)
        response["x-goog-metageneration"] = str(found.get("metageneration") or 1)


objects.download = download  # before the server module reads its routes

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main

    sys.exit(main())
