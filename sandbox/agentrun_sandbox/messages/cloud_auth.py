"""The clouds' sign-in, checked for real: AWS Signature Version 4 (recomputed with botocore from the
request as received), AWS STS's AssumeRoleWithWebIdentity (what IRSA's default chain calls), and
Google's OAuth token endpoint for service accounts (the JWT assertion's RS256 signature verified with
google-auth against the key this account issued).

A client that signs the wrong bytes, the wrong region or service, or with an unknown or expired key
is refused as each cloud refuses it, so the operator's use of the SDKs' signing is tested, not assumed.
"""

from __future__ import annotations

import datetime as dt
import hmac
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import exceptions as google_errors
from google.auth import jwt

_SIGV4 = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/"
    r"aws4_request, ?SignedHeaders=(?P<signed>[^,]+), ?Signature=(?P<signature>[0-9a-f]{64})"
)
#: How far a request's X-Amz-Date may be from now (AWS allows 15 minutes).
MAX_SKEW = dt.timedelta(minutes=15)
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: The audience a service account's assertion names, whatever token_uri it is posted to.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


@dataclass
class AwsAccount:
    """The keys Bedrock accepts in one region: long-lived pairs, temporary ones STS issued, and Bedrock
    API keys (bearer tokens)."""

    region: str = "us-east-1"
    keys: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    api_keys: set[str] = field(default_factory=set)
    #: Web identity tokens STS exchanges for temporary keys (IRSA's projected token), by role ARN.
    web_identities: dict[str, str] = field(default_factory=dict)
    signed_requests: int = 0

    def new_key(self) -> tuple[str, str]:
        key_id, secret = "AKIA" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30)
        self.keys[key_id] = (secret, None)
        return key_id, secret

    def refusal(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, str, str] | None:
        """(status, error type, message) when Bedrock would refuse the request's sign-in, else None."""
        authorization = headers.get("authorization", "")
        if authorization.startswith("Bearer "):
            token = authorization.removeprefix("Bearer ")
            if any(hmac.compare_digest(token, key) for key in self.api_keys):
                return None
            return 403, "authentication_error", "Invalid API Key format: Must start with pre-defined prefix"
        found = _SIGV4.fullmatch(authorization)
        if found is None:
            return 403, "authentication_error", "Missing Authentication Token"
        known = self.keys.get(found["key"])
        if known is None:
            return 403, "authentication_error", "The security token included in the request is invalid."
        secret, session = known
        if session is not None and headers.get("x-amz-security-token") != session:
            return 403, "authentication_error", "The security token included in the request is invalid."
        if found["service"] != "bedrock" or found["region"] != self.region:
            return (
                403,
                "authentication_error",
                (
                    "Credential should be scoped to a valid region and service: "
                    f"{found['region']}/{found['service']} is not {self.region}/bedrock"
                ),
            )
        stamp = headers.get("x-amz-date", "")
        try:
            when = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        except ValueError:
            return 403, "authentication_error", "Missing or malformed X-Amz-Date"
        if abs(dt.datetime.now(dt.UTC) - when) > MAX_SKEW or not stamp.startswith(found["date"]):
            return (
                403,
                "authentication_error",
                "Signature expired: the request's X-Amz-Date is too far from now",
            )
        signed = found["signature"]
        if not hmac.compare_digest(
            signed, self._signature(method, url, headers, body, found, secret, session)
        ):
            return (
                403,
                "authentication_error",
                ("The request signature we calculated does not match the signature you provided."),
            )
        self.signed_requests += 1
        return None

    def _signature(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        found: re.Match[str],
        secret: str,
        token: str | None,
    ) -> str:
        names = found["signed"].split(";")
        request = AWSRequest(
            method=method, url=url, data=body, headers={n: headers[n] for n in names if n in headers}
        )
        request.context["timestamp"] = headers["x-amz-date"]
        signer = SigV4Auth(Credentials(found["key"], secret, token), "bedrock", self.region)
        return str(
            signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
        )

    async def sts(self, request: web.Request) -> web.Response:
        """AssumeRoleWithWebIdentity: temporary keys for a role whose web identity token is known."""
        form = await request.post()
        role, token = str(form.get("RoleArn", "")), str(form.get("WebIdentityToken", ""))
        if form.get("Action") != "AssumeRoleWithWebIdentity":
            return _sts_error(400, "InvalidAction", f"Could not find operation {form.get('Action')!s}")
        expected = self.web_identities.get(role)
        if expected is None or not hmac.compare_digest(expected, token):
            return _sts_error(
                400, "InvalidIdentityToken", "Couldn't retrieve verification key from your identity provider"
            )
        key_id, secret, session = (
            "ASIA" + secrets.token_hex(8).upper(),
            secrets.token_urlsafe(30),
            secrets.token_urlsafe(60),
        )
        self.keys[key_id] = (secret, session)
        expires = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = (
            '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            "<AssumeRoleWithWebIdentityResult><Credentials>"
            f"<AccessKeyId>{key_id}</AccessKeyId><SecretAccessKey>{escape(secret)}</SecretAccessKey>"
            f"<SessionToken>{escape(session)}</SessionToken><Expiration>{expires}</Expiration>"
            f"</Credentials><AssumedRoleUser><Arn>{escape(role)}/agentrun</Arn>"
            "<AssumedRoleId>AROA:agentrun</AssumedRoleId></AssumedRoleUser>"
            "</AssumeRoleWithWebIdentityResult>"
            f"<ResponseMetadata><RequestId>{secrets.token_hex(16)}</RequestId></ResponseMetadata>"
            "</AssumeRoleWithWebIdentityResponse>"
        )
        return web.Response(text=body, content_type="text/xml")


def _sts_error(status: int, code: str, message: str) -> web.Response:
    body = (
        '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
        f"<Error><Type>Sender</Type><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
        "</ErrorResponse>"
    )
    return web.Response(text=body, status=status, content_type="text/xml")


@dataclass
class GoogleAccount:
    """Service accounts of one project, the access tokens the token endpoint issued to them, and tokens
    given out by other means (a metadata server, `gcloud auth print-access-token`)."""

    project: str = "agentrun-test"
    region: str = "us-east5"
    public_keys: dict[str, bytes] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    token_lifetime_seconds: int = 3600
    issued: int = 0

    def new_service_account(self, token_uri: str, name: str = "agentrun") -> dict[str, Any]:
        """A service account key file (as `gcloud iam service-accounts keys create` writes one)."""
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_id = secrets.token_hex(20)
        email = f"{name}@{self.project}.iam.gserviceaccount.com"
        self.public_keys[email] = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        return {
            "type": "service_account",
            "project_id": self.project,
            "private_key_id": key_id,
            "private_key": pem,
            "client_email": email,
            "client_id": str(secrets.randbits(64)),
            "token_uri": token_uri,
        }

    def new_token(self) -> str:
        token = "ya29." + secrets.token_urlsafe(40)
        self.tokens[token] = time.time() + self.token_lifetime_seconds
        return token

    def refusal(self, headers: Mapping[str, str]) -> tuple[int, str, str] | None:
        token = headers.get("authorization", "").removeprefix("Bearer ")
        expires = self.tokens.get(token)
        if expires is None or expires < time.time():
            return (
                401,
                "authentication_error",
                (
                    "Request had invalid authentication credentials. Expected OAuth 2 access token, "
                    "login cookie or other valid authentication credential."
                ),
            )
        return None

    async def token_endpoint(self, request: web.Request) -> web.Response:
        """The OAuth 2.0 JWT bearer grant (RFC 7523) as Google's token endpoint answers it."""
        form = await request.post()
        if form.get("grant_type") != JWT_BEARER:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        assertion = str(form.get("assertion", ""))
        try:
            claims = jwt.decode(assertion, verify=False)  # type: ignore[no-untyped-call]
            key = self.public_keys.get(str(claims.get("iss")))
            if key is None:
                raise ValueError(f"no such service account: {claims.get('iss')}")
            jwt.decode(assertion, certs=key, audience=GOOGLE_TOKEN_AUDIENCE)  # type: ignore[no-untyped-call]
        except (ValueError, google_errors.GoogleAuthError) as exc:
            return web.json_response({"error": "invalid_grant", "error_description": str(exc)}, status=400)
        if CLOUD_PLATFORM_SCOPE not in str(claims.get("scope", "")).split():
            return web.json_response({"error": "invalid_scope"}, status=400)
        self.issued += 1
        return web.json_response(
            {
                "access_token": self.new_token(),
                "expires_in": self.token_lifetime_seconds,
                "token_type": "Bearer",
            }
        )
