"""Email: mail Steward a task, get one threaded answer, even if it was down when you wrote.

    connector   EmailConnector: the watcher and the channel, started by `steward run`
    watcher     the IMAP loop: cursor, IDLE or polling, reconnects, UIDVALIDITY resync,
                a message that keeps failing quarantined
    intake      one message -> one commit (a turn, a skip record or a quarantine) + cursor
    cursor      the (UIDVALIDITY, UID) cursor document
    imap        the aioimaplib seam (ssl/starttls/none, BODY.PEEK[], APPEND, IDLE)
    parse       MIME -> Mail (text/plain preferred, HTML to text, attachments with a cap)
    headers     header decoding and message ids; charsets: bytes -> str, whatever they claim
    trim        quoted history and signatures cut for the model
    render      Mail -> the entry's text and data, attachment documents
    policy      RFC 3834, allowed senders, Authentication-Results
    threads     one conversation per thread; the reply subject
    reply       the outgoing message (a threaded reply, or a new thread for a message
                that answers no mail) and its deterministic Message-ID
    smtp        aiosmtplib sending, with hooks before DATA and after its final dot
    channel     EmailChannel: send with the Sent journal, find after a crash
    config      the [email] section; mbox: the `steward import --format mbox` reader
    errors      what goes wrong with mail, in one tree

Nothing is imported here, so the config model loads without the connector.
"""
