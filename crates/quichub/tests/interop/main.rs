//! Interoperability with independent MoQT implementations: moq-dev's relay,
//! clock and media CLI (over the IETF drafts and moq-lite), and aiomoqt (its
//! publisher script beside it).

mod interop_aiomoqt;
mod interop_moq_dev;
mod interop_moq_lite;
mod interop_moq_media;
mod moq_dev_kit;
