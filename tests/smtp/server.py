#!/usr/bin/env python3
"""A real SMTP server on loopback for tests/notify/notify_email.rs (aiosmtpd, installed by .ci/run).

    server.py --port 0 --mode starttls|tls|plain --cert CERT --key KEY [--auth USER:PASSWORD] --out DIR

Listens on 127.0.0.1 (port 0: any free port) and prints `ready <port>` once it accepts
connections. `starttls` offers STARTTLS and refuses every command but EHLO/NOOP/QUIT before
it; `tls` is implicit TLS (SMTPS) from the first byte; `plain` has no TLS. With --auth,
AUTH PLAIN/LOGIN with exactly those credentials is required before MAIL.

Recipients steer the answer to RCPT, so tests can provoke what real servers say:
`refuse…@` gets 550 (no such user), `busy…@` gets 450 (try again later); anyone else is
accepted. Each accepted message is written to DIR/<n>.eml, as received, after four
headers of its own: X-Test-Envelope-From, X-Test-Envelope-To (the RCPT addresses,
comma-separated), X-Test-TLS (the TLS version, or `none`) and X-Test-Auth (the login, or
`none`). Files appear whole (written aside, then renamed).

The server exits when its standard input closes, so a test that dies leaves no server.
"""

import argparse
import asyncio
import itertools
import logging
import os
import ssl
import sys
import warnings

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


class Handler:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.counter = itertools.count(1)

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@", 1)[0].lower()
        if local.startswith("refuse"):
            return f"550 5.1.1 <{address}>: Recipient address rejected: no such user"
        if local.startswith("busy"):
            return f"450 4.2.1 <{address}>: Mailbox busy, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        ssl_object = server.transport.get_extra_info("ssl_object")
        tls = ssl_object.version() if ssl_object is not None else "none"
        login = "none"
        if isinstance(session.auth_data, LoginPassword):
            login = session.auth_data.login.decode("utf-8", "replace")
        head = (
            f"X-Test-Envelope-From: {envelope.mail_from}\r\n"
            f"X-Test-Envelope-To: {', '.join(envelope.rcpt_tos)}\r\n"
            f"X-Test-TLS: {tls}\r\n"
            f"X-Test-Auth: {login}\r\n"
        ).encode()
        n = next(self.counter)
        final = os.path.join(self.out_dir, f"{n}.eml")
        partial = final + ".part"
        with open(partial, "wb") as f:
            f.write(head)
            f.write(envelope.original_content or envelope.content)
        os.rename(partial, final)
        return "250 2.0.0 Message accepted for delivery"


def authenticator_for(user, password):
    def authenticate(server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == user.encode()
            and auth_data.password == password.encode()
        )
        # handled=False: aiosmtpd answers a failure with 535 itself.
        return AuthResult(success=ok, handled=False, auth_data=auth_data)

    return authenticate


async def serve(args):
    loop = asyncio.get_running_loop()
    context = None
    if args.mode in ("starttls", "tls"):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.cert, args.key)
    smtp_kwargs = dict(
        hostname="smtp.test",
        # A stuck client must not hold a test forever.
        timeout=30,
        enable_SMTPUTF8=True,
    )
    if args.mode == "starttls":
        smtp_kwargs.update(tls_context=context, require_starttls=True)
    if args.auth is not None:
        user, _, password = args.auth.partition(":")
        smtp_kwargs.update(
            authenticator=authenticator_for(user, password),
            auth_required=True,
            # aiosmtpd only knows about TLS it started itself (STARTTLS); with implicit TLS
            # the socket is already encrypted, and with `plain` the test asks for clear text.
            auth_require_tls=args.mode == "starttls",
        )
    handler = Handler(args.out)
    server = await loop.create_server(
        lambda: SMTP(handler, loop=loop, **smtp_kwargs),
        host="127.0.0.1",
        port=args.port,
        ssl=context if args.mode == "tls" else None,
    )
    port = server.sockets[0].getsockname()[1]
    print(f"ready {port}", flush=True)
    # Serve until the test closes our standard input (or dies).
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    server.close()
    await server.wait_closed()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", choices=["starttls", "tls", "plain"], required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--auth", help="USER:PASSWORD; AUTH is then required")
    parser.add_argument("--out", required=True, help="directory for received .eml files")
    args = parser.parse_args()
    # aiosmtpd warns about AUTH without its own TLS; for `tls` that is wrong (the socket is
    # TLS) and for `plain` it is what the test asked for.
    warnings.simplefilter("ignore")
    logging.getLogger("mail.log").setLevel(logging.ERROR)
    if args.mode != "plain" and not (args.cert and args.key):
        parser.error(f"--mode {args.mode} needs --cert and --key")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
