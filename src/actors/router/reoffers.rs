//! [`Reoffers`]: a buyer's requests to put its failed leads back, as the
//! router keeps them until their requeue succeeded.

use crate::actors::buyer::ReofferLeads;

/// A buyer's requests to put its failed leads back: the one whose requeue
/// runs now, and one (the later requests, merged) waiting to run.
#[derive(Default)]
pub(super) struct Reoffers {
    pub(super) running: Option<ReofferLeads>,
    pub(super) waiting: Option<ReofferLeads>,
}

impl Reoffers {
    /// The running request's future is gone (a restart): it waits again.
    pub(super) fn stopped(&mut self) {
        if let Some(running) = self.running.take() {
            self.wait(running);
        }
    }

    pub(super) fn wait(&mut self, request: ReofferLeads) {
        self.waiting = Some(merged(self.waiting.take(), request));
    }
}

/// Two waiting requests for one buyer as one: the later moment, and all
/// leads if either wanted all.
fn merged(waiting: Option<ReofferLeads>, request: ReofferLeads) -> ReofferLeads {
    match waiting {
        None => request,
        Some(earlier) => ReofferLeads {
            failed_before: earlier.failed_before.max(request.failed_before),
            limit: earlier.limit.zip(request.limit).map(|(a, b)| a.max(b)),
            ..request
        },
    }
}
