"""A self-signed certificate for 127.0.0.1 and localhost (valid until 2126), for the TLS
tests of the email connector: Dovecot (imaps and STARTTLS) and aiosmtpd use it, the client
trusts it through an injected SSL context. Test-only; never used outside loopback."""

import ssl
import tempfile
from pathlib import Path

CERT = """-----BEGIN CERTIFICATE-----
MIIDJzCCAg+gAwIBAgIUG/ZHeKVRuYMltczijzCGGjrOqsAwDQYJKoZIhvcNAQEL
BQAwFDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEzMDA3NTAwMloYDzIxMjYx
MTA2MDc1MDAyWjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwggEiMA0GCSqGSIb3DQEB
AQUAA4IBDwAwggEKAoIBAQDUSg42hbmxwDqD2TWShGAh1OIarW7njDeobKGPj368
x+8y87E9aQch246k/BJa7tW9abAahW6bOdtBkVpZMJtotmfov8xmx8gCZYp6Ux4+
zCh4JcscG1vX8TAoqV8hu2c8eF9RWlgwS6pNQtWoXonI3rsPG70GDVfZCn2W70Eh
BY0otqJatJmlyRqYDrOmkpDMijOP73JNx9VxVHUU93Pe1LydVF+el7ivS4lOgf7C
7W3q4igpwzHtp8xrRkPpfRTHhJBfxQn1x0f+HJqGy+SptoCe5khpmwA/bEujRKLQ
C2FLIcqlHRBMaPO6hKNHH9LxSaO45QJgk8KbMjivLbW9AgMBAAGjbzBtMB0GA1Ud
DgQWBBR9oiofnllLNMTOycyFd12nqNqqCTAfBgNVHSMEGDAWgBR9oiofnllLNMTO
ycyFd12nqNqqCTAPBgNVHRMBAf8EBTADAQH/MBoGA1UdEQQTMBGHBH8AAAGCCWxv
Y2FsaG9zdDANBgkqhkiG9w0BAQsFAAOCAQEAEtuzHxpdwsLZrDnGNocVarnlMf86
liqgUO+Zxg3sviZwN7tcwD5QdXeWf3lZvbBEcn4PHPRl15vbiVFaLcE79h6qJmN/
caPu7RAA6uuAnXiRVVfZtxXlyOJVvH2UVSG2wXwqxZ9m48uKVECiV5nz6NGi5YU0
dYq/m2MYso+IXIg99CAmm9T8n5dmOGg3lHIQZo+/nrdyhRaXPAYYiOmOhM2V1GhD
HQ2BRp5NY54L1dTDHXWQGMjxu1XxAgrv1ueXWICMzpjulcxWlCKDeHlQJNPQ+JBN
1r8yDpaFY7dQCtZQdr7ycsre3KOa2RwJ1U1m1n6Jlbeg39DDJu74T00M+w==
-----END CERTIFICATE-----
"""

KEY = """-----BEGIN PRIVATE KEY-----
MIIEvwIBADANBgkqhkiG9w0BAQEFAASCBKkwggSlAgEAAoIBAQDUSg42hbmxwDqD
2TWShGAh1OIarW7njDeobKGPj368x+8y87E9aQch246k/BJa7tW9abAahW6bOdtB
kVpZMJtotmfov8xmx8gCZYp6Ux4+zCh4JcscG1vX8TAoqV8hu2c8eF9RWlgwS6pN
QtWoXonI3rsPG70GDVfZCn2W70EhBY0otqJatJmlyRqYDrOmkpDMijOP73JNx9Vx
VHUU93Pe1LydVF+el7ivS4lOgf7C7W3q4igpwzHtp8xrRkPpfRTHhJBfxQn1x0f+
HJqGy+SptoCe5khpmwA/bEujRKLQC2FLIcqlHRBMaPO6hKNHH9LxSaO45QJgk8Kb
MjivLbW9AgMBAAECggEAAsKkXZeWASet87dlnxWh3XE2ax5iMWcHCQL85jA0i1x4
oIarlQFMJHGjK81m97J+FocH5NyyEN4GB1vEU+a2+a0fWWDLOF83G1SQNcaq5ses
MOKETbvfLp6NnUr3usbc4iq2hQkNFM/9NdJupu30/jqSQfFrKN3BZUf/VNM+DHon
wyqpIT0kKhWB7Ea1AdJPrUgUbJqjPa99TKIkvjA1s00LkxavwuhT8TLkUleDoZOg
QSMldKlx6BVxlNmy6gYSAHBdp2vjxSRyI1PFzBbSC1w1pWyF301Vyls3t2cKj9YG
5uTzw+yhxHqgYoJx2GfvnX9JB3hAxH5uwHUT0GxTSQKBgQD+brTao+B1sqGToM/v
QKQ+3wVvG10Y+I1oxNwrU+rRJ/h8nvKsv2XnVo50iPt6miviiWMz9YVdIi0HWBkT
BnZvMRp17iyIFom4CWX09typIL/nrOE9yPbvVCPxc9jMlhDY7QHb98zHNHa5yBIx
ZzL8N2Rohpp1Dwk/GtVT3mx9GwKBgQDVmOFihwzvubY+1rQZJC7aHXkpptCaxcex
jCVsFixrrWSPcq3vB9biIJCIXHnErMrK4sMV6H9V+fBPRR99IxC283qfD2Gona9h
tsMoTrh4fPZ64BUm33UyVbJOxJ2T6vRNfKBEAkf3aqZmnzDZAhl6jav+hE/vNuH0
AVyUxxl+BwKBgQCgFONxVP5az0Nd8SYi8Fbmv8dZeqv+lBPUwVeNY0Uwx6dOMWua
SOpCvXDv3WfsYagO5kYmYOnCCUivgDx2ffByUUDGxk36acPIqREfKVr4hoR3rYwi
JZlIR3Y96peTUS/UbHpo/eY3x8iTZ1AbCUVI70kbguUXlZhJvgZOuHkl1QKBgQCV
jDV5Y27WRSNpOa/czm2TPwF+/RGe24zmLWZiF+A//6WhnbxT2BxGNGCdaInE/un5
RO0r4J2O17C9/3p9hdiFD1GyHfXVNZn+gxR+mycjDPMRsuR8VAXdGQz/gz+EugMU
YYZgN2yluOEKhriPp52pJZnfWEoTBU0MJwvoCsI5bwKBgQDKESKwYfi2WdAeVvts
En4lc64xif9ZXtDjeoP2G05r7+ToTaRPFjPVK1Ld9Svx2apQWF9aSbEcXT++n9qz
tUNHHp5gpDzCnQPjus/SxZWSigYfjiuYUJQtQgYqPZC83gGPSEGRCbIlSP6DhgSC
oco2xaVcTjNuN6td6gsFvHocsw==
-----END PRIVATE KEY-----
"""


def write_pair(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    cert.write_text(CERT)
    key.write_text(KEY)
    key.chmod(0o600)
    return cert, key


def client_context() -> ssl.SSLContext:
    """Trusts exactly this certificate."""
    return ssl.create_default_context(cadata=CERT)


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = write_pair(Path(tmp))
        context.load_cert_chain(cert, key)
    return context
