"""Creates a bucket on a loopback S3 endpoint (moto) and uploads a directory's files.

usage: s3_upload.py ENDPOINT BUCKET DIR [PREFIX] [--versioning]
Idempotent: an existing bucket is reused, objects are overwritten. Prints the seconds taken.
"""
import os
import sys
import time

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    versioning = "--versioning" in sys.argv
    endpoint, bucket, src = args[:3]
    prefix = args[3].strip("/") + "/" if len(args) > 3 and args[3].strip("/") else ""
    assert endpoint.startswith("http://127.") or endpoint.startswith("http://localhost"), "loopback only"
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    t0 = time.monotonic()
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    if versioning:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    cfg = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4)
    n = 0
    for root, _dirs, files in os.walk(src):
        for f in sorted(files):
            path = os.path.join(root, f)
            key = prefix + os.path.relpath(path, src)
            s3.upload_file(path, bucket, key, Config=cfg)
            n += 1
    print(f"uploaded {n} file(s) to s3://{bucket}/{prefix} in {time.monotonic() - t0:.2f}s")


if __name__ == "__main__":
    main()
