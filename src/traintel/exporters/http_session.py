"""An HTTP session for the OTLP/HTTP exporters that honours ``OTEL_EXPORTER_OTLP_CERTIFICATE``.

Why: the SDK's HTTP exporter puts the configured CA file on its ``requests.Session`` as
``session.verify``, but ``requests`` lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` override a
session-level ``verify`` on every request (psf/requests#3829). Those variables are set on many
clusters, conda environments and CI images, and there the collector's private CA is silently
ignored and every export fails certificate verification. This session keeps a CA file that
was configured on it; every other environment setting (proxies, ``no_proxy``) still applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from traintel.exporters.tls_errors import tls_targets


class CertificateSession(requests.Session):
    def merge_environment_settings(
        self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> dict[str, Any]:
        settings: dict[str, Any] = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and isinstance(self.verify, str):  # a CA file configured on the session
            settings["verify"] = self.verify
        return settings


def needs_certificate_session(signal: str, environ: Mapping[str, str]) -> bool:
    """True when a CA file is configured for ``signal``'s OTLP/HTTP exporter."""
    return tls_targets(environ)[signal].certificate is not None
