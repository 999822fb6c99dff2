"""The SDK's Bedrock and Vertex AI clients for a run's `ModelAccess`, configured like the Anthropic one.

Requests through them are the SDK's own: Bedrock's are signed with SigV4 by botocore per request
(so credentials that rotate, as IRSA's and Pod Identity's do, are picked up) or carry a Bedrock API
key; Vertex AI's carry an OAuth token google-auth refreshes before it expires. The SDK's retries stay
off (the loop owns the one retry layer) and so do its OpenTelemetry spans, as for Anthropic's API.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2

from agentrun.loop.errors import FatalModelError, ModelCallError, RetryableModelError, RetryClass
from agentrun.model.access import ModelAccess

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: What the SDK's clients share; one type for the adapter whichever provider serves the run.
MessagesClient = anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex


def cloud_client(
    access: ModelAccess, *, http_client: httpx2.AsyncClient, timeout: float, telemetry: Any
) -> anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex:
    """A Bedrock or Vertex AI client; ValueError when the access names neither."""
    common: dict[str, Any] = {
        "base_url": access.base_url,
        "max_retries": 0,
        "timeout": timeout,
        "http_client": http_client,
        "open_telemetry": telemetry,
    }
    if access.provider == "bedrock":
        keys = access.aws_keys
        return anthropic.AsyncAnthropicBedrock(
            aws_region=access.region,
            aws_access_key=keys.access_key_id if keys else None,
            aws_secret_key=keys.secret_access_key if keys else None,
            aws_session_token=keys.session_token if keys else None,
            # None: the operator's AWS_BEARER_TOKEN_BEDROCK when set, else botocore's default chain.
            api_key=access.api_key,
            **common,
        )
    if access.provider == "vertex":
        credentials = None
        if access.google_credentials is not None:
            credentials = google_credentials(access.google_credentials)
        return anthropic.AsyncAnthropicVertex(
            region=access.region or anthropic.NOT_GIVEN,
            project_id=access.project_id or anthropic.NOT_GIVEN,
            credentials=credentials,
            **common,
        )
    raise ValueError(f"not a cloud provider: {access.provider}")


def google_credentials(info: Any) -> Any:
    """Credentials from a service account key (the only kind read from a Secret: see
    credential_reading), scoped for Vertex AI; the first token is fetched on the first request."""
    from google.oauth2 import service_account

    return service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
        dict(info), scopes=[CLOUD_PLATFORM_SCOPE]
    )


def google_errors() -> type[Exception]:
    """What google-auth raises for a credentials file it cannot use."""
    from google.auth import exceptions

    return exceptions.GoogleAuthError


def sign_in_failed(exc: Exception) -> ModelCallError | None:
    """A cloud sign-in that failed before the request went out, in the loop's terms (None: not one).

    google-auth refreshes a token and botocore resolves credentials (STS for IRSA) inside the SDK's
    request, so their errors arrive as they are: a token or STS endpoint that could not be reached is
    retried like a dropped connection; credentials refused or not found end the run
    AuthenticationFailed, with the library's own words.
    """
    module = type(exc).__module__
    if module.startswith("google.auth"):
        from google.auth import exceptions

        if isinstance(exc, exceptions.TransportError) or getattr(exc, "retryable", False):
            return RetryableModelError(
                f"Google sign-in did not answer: {exc}", retry_class=RetryClass.CONNECTION
            )
        return FatalModelError(f"Google sign-in refused: {exc}", reason="AuthenticationFailed")
    if module.startswith("botocore"):
        from botocore import exceptions as aws

        if isinstance(exc, aws.HTTPClientError | aws.EndpointConnectionError):
            return RetryableModelError(
                f"AWS sign-in did not answer: {exc}", retry_class=RetryClass.CONNECTION
            )
        return FatalModelError(f"AWS sign-in refused: {exc}", reason="AuthenticationFailed")
    if isinstance(exc, RuntimeError):
        if str(exc).startswith("Could not resolve"):
            # The SDK's own words when a default chain found nothing (no AWS credentials, no Google token).
            return FatalModelError(f"no cloud credentials: {exc}", reason="AuthenticationFailed")
        # The SDK's cloud clients refuse a request they cannot address the same way every time.
        return FatalModelError(f"the model client cannot send the request: {exc}", reason="ModelError")
    return None
