"""The IAM policies of docs/deployment.md, read from the page itself, and the check that a run's AWS calls are
all allowed by its role's policy.

A run records its calls with KCL_PIPELINE_AWS_CALL_LOG (kcl_pipeline/kcl/shells/aws.py: one JSON line per call,
with the parameters naming what it acts on). Each call becomes the IAM actions and resources AWS authorises it
by (`required`), and each of those must be allowed by a statement of the role's policy (`allows`): its action
named, its resource matching one of the statement's after the page's placeholders (`<region>`, `<stream>`, …)
are replaced by the run's values, and its conditions met. The evaluator knows what the policies use: Allow
statements, exact actions, `*` in resources, StringEquals / StringLike conditions.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterable, Mapping

DEPLOYMENT_DOC = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
POLICY_ID_PREFIX = "kcl-pipeline-"
ROLES = ("consumer-host", "code-location", "spark-executors")
# The emulators' account (kinesis-local's stream ARNs carry it); DynamoDB and S3 ARNs are built with it too.
EMULATOR_ACCOUNT = "000000000000"

_S3_BUCKET_ACTIONS = {"ListObjectsV2": "s3:ListBucket", "ListObjects": "s3:ListBucket", "HeadBucket": "s3:ListBucket",
                      "CreateBucket": "s3:CreateBucket", "ListMultipartUploads": "s3:ListBucketMultipartUploads"}
_S3_OBJECT_ACTIONS = {"GetObject": ("s3:GetObject",), "HeadObject": ("s3:GetObject",),
                      "PutObject": ("s3:PutObject",), "CreateMultipartUpload": ("s3:PutObject",),
                      "UploadPart": ("s3:PutObject",), "CompleteMultipartUpload": ("s3:PutObject",),
                      "AbortMultipartUpload": ("s3:AbortMultipartUpload",),
                      "ListParts": ("s3:ListMultipartUploadParts",), "DeleteObject": ("s3:DeleteObject",)}


@dataclass(frozen=True)
class Need:
    """One authorisation a call needs: an action on a resource (None: the call names none, e.g. GetRecords by
    iterator, a ListShards page by token; then any resource the policy allows the action on will do), with the
    condition keys AWS evaluates for it."""

    action: str
    resource: str | None
    context: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        extra = "".join(f" [{k}={v}]" for k, v in self.context)
        return f"{self.action} on {self.resource or '(the call names no resource)'}{extra}"


def documented_policies(path: Path = DEPLOYMENT_DOC) -> dict[str, dict[str, Any]]:
    """The page's policies by role: every ```json block whose `Id` is kcl-pipeline-<role>."""
    blocks = re.findall(r"```json\n(.*?)\n```", path.read_text(), flags=re.S)
    policies = {}
    for block in blocks:
        document = json.loads(block)
        ident = document.get("Id", "") if isinstance(document, dict) else ""
        if ident.startswith(POLICY_ID_PREFIX):
            policies[ident[len(POLICY_ID_PREFIX):]] = document
    return policies


def read_calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def required(call: Mapping[str, Any], *, kms_key_arn: str | None = None) -> list[Need]:
    """The authorisations one recorded call needs. Raises KeyError for a call this table does not know: a new
    kind of call must be mapped here (and documented) before the test passes."""
    service, operation = call["call"].split(":", 1)
    region = call.get("region") or "*"
    if service == "kinesis":
        resource = call.get("ConsumerARN") or call.get("StreamARN") or (
            f"arn:aws:kinesis:{region}:{EMULATOR_ACCOUNT}:stream/{call['StreamName']}" if call.get("StreamName")
            else None)
        if operation in ("DescribeStreamConsumer", "DeregisterStreamConsumer") \
                and call.get("ConsumerName") and call.get("StreamARN") and not call.get("ConsumerARN"):
            resource = f"{call['StreamARN']}/consumer/{call['ConsumerName']}:*"
        return [Need(f"kinesis:{operation}", resource)]
    if service == "dynamodb":
        table = call.get("TableName")
        resource = f"arn:aws:dynamodb:{region}:{EMULATOR_ACCOUNT}:table/{table}" if table else None
        if resource and call.get("IndexName"):
            resource += f"/index/{call['IndexName']}"
        return [Need(f"dynamodb:{operation}", resource)]
    if service == "cloudwatch":
        if operation != "PutMetricData":
            raise KeyError(call["call"])
        return [Need("cloudwatch:PutMetricData", "*", (("cloudwatch:namespace", call.get("Namespace", "")),))]
    if service == "s3":
        bucket = call["Bucket"]
        if operation in _S3_BUCKET_ACTIONS:
            return [Need(_S3_BUCKET_ACTIONS[operation], f"arn:aws:s3:::{bucket}")]
        if operation == "DeleteObjects":
            return [Need("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{key}") for key in call.get("Keys", ())]
        needs = [Need(action, f"arn:aws:s3:::{bucket}/{call['Key']}") for action in _S3_OBJECT_ACTIONS[operation]]
        if call.get("SSEKMSKeyId"):
            # S3 asks KMS for a data key to encrypt with, and a multipart upload decrypts it again per part.
            needs.append(Need("kms:GenerateDataKey", kms_key_arn or call["SSEKMSKeyId"]))
            if operation == "CreateMultipartUpload":
                needs.append(Need("kms:Decrypt", kms_key_arn or call["SSEKMSKeyId"]))
        elif kms_key_arn and operation in ("GetObject", "UploadPart", "CompleteMultipartUpload"):
            needs.append(Need("kms:Decrypt", kms_key_arn))  # objects written with the key are read with it
        return needs
    raise KeyError(call["call"])


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _fill(pattern: str, values: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise KeyError(f"the policy's placeholder <{name}> has no value in this run")
        return values[name]

    return re.sub(r"<([a-z-]+)>", replace, pattern)


def _condition_holds(condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, str],
                     values: Mapping[str, str]) -> bool:
    for operator, keys in condition.items():
        for key, expected in keys.items():
            actual = context.get(key)
            wanted = [_fill(v, values) for v in _listed(expected)]
            if operator == "StringEquals":
                if actual is None or actual not in wanted:
                    return False
            elif operator == "StringLike":
                if actual is None or not any(fnmatchcase(actual, w) for w in wanted):
                    return False
            else:
                raise AssertionError(f"the evaluator does not know the condition operator {operator}")
    return True


def allows(policy: Mapping[str, Any], need: Need, values: Mapping[str, str]) -> bool:
    context = dict(need.context)
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow", "the documented policies only allow"
        if need.action not in _listed(statement["Action"]):
            continue
        resources = [_fill(r, values) for r in _listed(statement["Resource"])]
        if need.resource is not None and not any(fnmatchcase(need.resource, r) for r in resources):
            continue
        if _condition_holds(statement.get("Condition", {}), context, values):
            return True
    return False


def denied(policy: Mapping[str, Any], calls: Iterable[Mapping[str, Any]], values: Mapping[str, str], *,
           kms_key_arn: str | None = None) -> list[str]:
    """Each distinct authorisation the calls need and the policy does not give, with a call that needed it."""
    missing: dict[str, str] = {}
    for call in calls:
        try:
            needs = required(call, kms_key_arn=kms_key_arn)
        except KeyError:
            missing.setdefault(f"{call['call']}: no IAM mapping in kcl_pipeline_tests/iam_policies.py", call["call"])
            continue
        for need in needs:
            if not allows(policy, need, values):
                missing.setdefault(str(need), call["call"])
    return [f"{need} (needed by {call})" for need, call in sorted(missing.items())]
