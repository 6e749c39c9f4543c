mod capsule;
mod connect;
mod error;
mod frame;
mod settings;
mod stream;
mod varint;

pub use capsule::*;
pub use connect::*;
pub use error::*;
pub use frame::*;
pub use settings::*;
pub use stream::*;
pub use varint::*;

pub use http;

mod huffman;
/// quichub patch: public so a server can decode and encode the field sections of
/// plain HTTP/3 requests on the connections it also serves WebTransport on.
pub mod qpack;
