"""Why a file was not read. Every failure to read a shared file is one of these, with a
reason a person can act on; it becomes the attachment's note, never a traceback.

    Unreadable          the file cannot be read as what it is (corrupt, encrypted, lying)
     └── TooLarge       it would take more than the limits allow (pixels, decoded bytes,
                        parts, inflated bytes, XML depth and elements, the reader's memory)
"""


class Unreadable(Exception):
    """`str()` is the reason, in a few words for the message's note."""


class TooLarge(Unreadable):
    pass
