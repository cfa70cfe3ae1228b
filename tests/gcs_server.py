"""A local GCS JSON API server for the bucket tests: the `gcp-storage-emulator` package, in memory,
on 127.0.0.1, with one bucket.

    python tests/gcs_server.py PORT BUCKET

One gap of the emulator is filled: GCS answers a media download with the object's generation in
`x-goog-generation` (and `x-goog-metageneration`); the emulator leaves them out. TensorStore
(orbax's array writer) reads the generation of an OCDBT manifest from that header before its
conditional rewrite, and fails with "Malformed StorageGeneration" without it. Everything else is
the emulator as published; in particular it ignores ifGenerationMatch preconditions.
"""

import sys

from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except Exception:  # not found: the emulator's own answer stands
    return
  response["x-goog-generation"] = str(obj["generation"])
  response["x-goog-metageneration"] = str(obj["metageneration"])


objects.download = _download_with_generation  # before the server module builds its routes

from gcp_storage_emulator import server  # noqa: E402

if __name__ == "__main__":
  port, bucket = int(sys.argv[1]), sys.argv[2]
  s = server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  s.run()
