"""A moto S3 client that answers the way S3 answers a caller whose policies allow only some calls.

moto grants every call; S3 does not. Two documented behaviours matter to our existence checks:
- HeadObject (and GetObject) on a missing key answers 404 only to a caller allowed s3:ListBucket on the
  bucket, 403 to anyone else (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html); a
  HeadObject request carries no `s3:prefix`, so a ListBucket grant conditioned on one does not count.
- ListObjectsV2 is s3:ListBucket, and its Prefix parameter is the `s3:prefix` condition key
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/amazon-s3-policy-keys.html).
A bucket policy's Deny on reading a prefix answers 403 to HeadObject whether or not the key exists.
"""

from __future__ import annotations

from botocore.exceptions import ClientError


def _refused(operation: str, code: str = "403") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "Forbidden"}}, operation)


class S3AsAwsAnswers:
    def __init__(
        self,
        client,
        *,
        may_list_bucket: bool,
        may_list_prefixes: tuple[str, ...] = (),
        read_denied_prefixes: tuple[str, ...] = (),
    ) -> None:
        self._client = client
        self._may_list_bucket = may_list_bucket  # ListBucket with no s3:prefix condition
        self._may_list_prefixes = may_list_prefixes  # ListBucket only for StringEquals s3:prefix
        self._read_denied = read_denied_prefixes
        self.calls: list[str] = []

    def head_object(self, *, Bucket: str, Key: str, **kwargs):  # noqa: N803 - boto3's names
        self.calls.append("head_object")
        if Key.startswith(self._read_denied):
            raise _refused("HeadObject")
        try:
            return self._client.head_object(Bucket=Bucket, Key=Key, **kwargs)
        except ClientError as error:
            if error.response["Error"]["Code"] in ("404", "NoSuchKey") and not self._may_list_bucket:
                raise _refused("HeadObject") from None
            raise

    def list_objects_v2(self, *, Bucket: str, Prefix: str = "", **kwargs):  # noqa: N803
        self.calls.append("list_objects_v2")
        if not self._may_list_bucket and Prefix not in self._may_list_prefixes:
            raise _refused("ListObjectsV2", "AccessDenied")
        return self._client.list_objects_v2(Bucket=Bucket, Prefix=Prefix, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._client, name)
