"""The real control plane's certificates: one CA, the API server's serving certificate, client
certificates for the components and the administrator, and the service-account signing key.

kube-apiserver authenticates a client certificate signed by ``--client-ca-file`` as user = CN and
groups = O (staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go ``CommonNameUserConversion``);
``system:masters`` is the group the default RBAC policy binds to cluster-admin
(plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go). The controller manager and scheduler use
the identities the bootstrap policy grants: ``system:kube-controller-manager`` and ``system:kube-scheduler``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Who each client certificate names (CN, O).
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("realkube-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    # kwok acts for every fake node's kubelet; it needs more than system:node (the Node authorizer
    # would bind it to one node name), so it is an administrator, as kwokctl sets it up.
    "kwok": ("kwok-controller", ("system:masters",)),
}


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca-key.pem"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}-key.pem"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa-key.pem"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name(attrs)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_pki(directory: Path, *, days: int = 7) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("realkube CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.ca_key.write_bytes(_pem_key(ca_key))

    def leaf(name: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName] | None) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        pki.cert(name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pki.key(name).write_bytes(_pem_key(key))

    leaf("apiserver", _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH,
         [x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
          x509.DNSName("kubernetes.default.svc"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
          x509.IPAddress(ipaddress.ip_address("10.0.0.1"))])
    for name, (cn, orgs) in CLIENTS.items():
        leaf(name, _name(cn, orgs), ExtendedKeyUsageOID.CLIENT_AUTH, None)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki.service_account_key.write_bytes(_pem_key(sa_key))
    pki.service_account_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
