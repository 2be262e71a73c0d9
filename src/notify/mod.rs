//! Accountable delivery (SPEC section 7): what goes to a notify channel or
//! an event sink for one lead, and how it is sent. Channels are webhooks
//! (JSON or `body_template`), Slack incoming webhooks and the Telegram Bot
//! API (a readable text message) and e-mail over SMTP; sinks get JSON
//! events. The rows that decide what is owed live in `store::deliveries`,
//! the actor that sends them in `actors::courier`.

mod destination;
mod message;
mod transport;

pub use destination::Destination;
pub use message::{prepare, Outbound, Prepared, SaleFacts};
pub use transport::Transport;
