"""aws.py's clients read botocore's data through one loader per process: parsed once, shared by every client
(and, under the forkserver, by every worker), while each client keeps its own session and credentials."""
from __future__ import annotations

from kcl_pipeline.kcl.shells import aws
from kcl_pipeline.kcl.shells.aws import AwsSettings, boto3_session, client

SETTINGS = AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9")


def test_clients_share_botocore_data_and_keep_their_own_sessions(monkeypatch):
    client("kinesis", SETTINGS), client("dynamodb", SETTINGS)
    loader = aws._loader
    assert loader is not None
    read: list[str] = []
    real = loader.file_loader.load_file
    monkeypatch.setattr(loader.file_loader, "load_file", lambda path: read.append(path) or real(path))
    first, second = client("kinesis", SETTINGS), client("kinesis", SETTINGS)
    assert read == [], "a new client parsed botocore's data again (the endpoints alone are ~7 MB)"
    assert first._endpoint is not second._endpoint and first._request_signer is not second._request_signer
    for _ in range(5):
        boto3_session()
    assert len(loader.search_paths) == len(set(loader.search_paths)), "boto3's data path was added again"
    assert any(path.endswith("boto3/data") for path in loader.search_paths)


def test_s3_clients_keep_boto3s_transfer_methods():
    assert hasattr(client("s3", SETTINGS), "upload_fileobj")
