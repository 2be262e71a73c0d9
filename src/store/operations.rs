//! What operators do to leads through the admin API: fix an invalid lead,
//! reroute (a set-aside lead too), record a return (its cap slots given
//! back); and the alert list. Settling an `unknown` lead is `resolve`. Every change is a conditional
//! UPDATE on the lead's state, so two operators (or an operator and the
//! router) cannot both win; the one-sale rule stays with the unique index.

use chrono::Utc;
use entity::{alert, attempt, lead, sale};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, TransactionTrait,
};
use serde_json::{Map, Value};

use super::handle::Store;
use super::{caps, person};
use crate::config::DuplicateRule;
use crate::domain::{new_id, AttemptKind, AttemptOutcome, CallOutcome, FieldError, LeadState};

/// Why an operator's change was not made.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    #[error("no such lead")]
    NotFound,
    #[error("{0}")]
    Conflict(String),
    /// The change breaks a rule of its own (`rule` names it); nothing was
    /// changed.
    #[error("{message}")]
    Refused { rule: &'static str, message: String },
    #[error(transparent)]
    Database(#[from] DbErr),
}

impl Store {
    /// Replaces an invalid lead's normalised fields and errors (the raw
    /// payload stays as it arrived); without errors it moves to `received`,
    /// claiming its duplicate-key values as intake does (the same person
    /// within the window makes it a `duplicate`), in the same transaction.
    /// `accept`: no notify channel is required, so a fixed lead is
    /// `accepted` at once.
    pub async fn fix_invalid_lead(
        &self,
        lead_id: &str,
        fields: Map<String, Value>,
        errors: &[FieldError],
        rule: &DuplicateRule,
        accept: bool,
    ) -> Result<lead::Model, OperationError> {
        let state = if errors.is_empty() {
            LeadState::Received
        } else {
            LeadState::Invalid
        };
        let txn = self.db.begin().await?;
        let mut fix = transition(lead_id, &[LeadState::Invalid.as_str()], state.as_str());
        if accept && state == LeadState::Received {
            fix = fix.col_expr(lead::Column::AcceptedAt, Expr::value(Utc::now()));
        }
        let changed = fix
            .col_expr(lead::Column::Fields, Expr::value(Value::Object(fields)))
            .col_expr(
                lead::Column::Errors,
                Expr::value(serde_json::to_value(errors).unwrap_or_default()),
            )
            .exec(&txn)
            .await?
            .rows_affected;
        if changed == 1 && state == LeadState::Received {
            if let Some(row) = lead::Entity::find_by_id(lead_id.to_string())
                .one(&txn)
                .await?
            {
                person::mark_duplicates(&txn, &[&row], rule).await?;
            }
        }
        txn.commit().await?;
        self.after_change(lead_id, changed, "only an invalid lead can be fixed")
            .await
    }

    /// Replaces the normalised fields and errors of a lead that is not
    /// invalid (its state stays; see `fix_invalid_lead` for invalid ones).
    /// A `received` lead that became invalid goes to the review queue.
    pub async fn refresh_fields(
        &self,
        lead: &lead::Model,
        fields: Map<String, Value>,
        errors: &[FieldError],
    ) -> Result<(), DbErr> {
        let state = match LeadState::parse(&lead.state) {
            Some(LeadState::Received) if !errors.is_empty() => LeadState::Invalid.as_str(),
            _ => lead.state.as_str(),
        };
        transition(&lead.id, &[lead.state.as_str()], state)
            .col_expr(lead::Column::Fields, Expr::value(Value::Object(fields)))
            .col_expr(
                lead::Column::Errors,
                Expr::value(serde_json::to_value(errors).unwrap_or_default()),
            )
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// A source's leads that arrived since `since`, `limit` at a time after
    /// the id `after` (ids sort by arrival).
    pub async fn leads_of_source(
        &self,
        source_id: &str,
        since: chrono::DateTime<Utc>,
        after: Option<&str>,
        limit: u64,
    ) -> Result<Vec<lead::Model>, DbErr> {
        let mut query = lead::Entity::find()
            .filter(lead::Column::SourceId.eq(source_id))
            .filter(lead::Column::ReceivedAt.gte(since));
        if let Some(after) = after {
            query = query.filter(lead::Column::Id.gt(after));
        }
        query
            .order_by_asc(lead::Column::Id)
            .limit(limit)
            .all(&self.db)
            .await
    }

    /// Puts an `unsold` or `unknown` lead, or one set aside after routing
    /// failures, back to be routed, with a new routing history;
    /// `include_tried` lets buyers it was posted to before be offered it
    /// again. An `unknown` lead's unanswered posts give back their cap
    /// slots: it is rerouted once its buyer said the post did not sell.
    pub async fn reroute_lead(
        &self,
        lead_id: &str,
        include_tried: bool,
    ) -> Result<lead::Model, OperationError> {
        let set_aside_or_settled = Condition::any()
            .add(lead::Column::State.ne(LeadState::Received.as_str()))
            .add(lead::Column::SetAsideReason.is_not_null());
        let reroute = |from: &[&str]| {
            transition(lead_id, from, LeadState::Received.as_str())
                .filter(set_aside_or_settled.clone())
                .col_expr(
                    lead::Column::SetAsideReason,
                    Expr::value(Option::<String>::None),
                )
                .col_expr(lead::Column::RouteFailures, Expr::value(0))
                .col_expr(
                    lead::Column::RouteAfter,
                    Expr::value(Option::<chrono::DateTime<Utc>>::None),
                )
        };
        let txn = self.db.begin().await?;
        let from_unknown = reroute(&[LeadState::Unknown.as_str()])
            .exec(&txn)
            .await?
            .rows_affected;
        let changed = if from_unknown == 1 {
            // An unknown lead is rerouted once its buyer said the post did
            // not sell: the unanswered posts' cap slots come back.
            release_unanswered_posts(&txn, lead_id, GiveBack::All).await?;
            from_unknown
        } else {
            let settled = [LeadState::Unsold.as_str(), LeadState::Received.as_str()];
            reroute(&settled).exec(&txn).await?.rows_affected
        };
        if changed == 1 {
            new_history(lead_id, include_tried).exec(&txn).await?;
        }
        txn.commit().await?;
        self.after_change(
            lead_id,
            changed,
            "only an unsold or unknown lead, or one set aside, can be rerouted",
        )
        .await
    }

    /// After a retried post to `buyer_id` sold the lead: the lead's earlier
    /// posts to that buyer that got no answer give back the cap slots they
    /// kept in case they sold (one sale, one slot). Outside a transaction:
    /// a slot not given back (a crash between two statements) stays
    /// counted, which keeps the cap, never exceeds it.
    pub async fn release_earlier_unanswered_posts(
        &self,
        lead_id: &str,
        buyer_id: &str,
    ) -> Result<(), DbErr> {
        release_unanswered_posts(&self.db, lead_id, GiveBack::OfBuyer(buyer_id)).await?;
        Ok(())
    }

    /// Records that the buyer returned a sold lead: the sale is marked
    /// returned (so it no longer counts as the lead's one sale) and the lead
    /// becomes `unsold`, or `received` with a new history when `reroute`
    /// (the buyer that returned it is not offered it again).
    pub async fn return_lead(
        &self,
        lead_id: &str,
        reason: &str,
        reroute: bool,
    ) -> Result<lead::Model, OperationError> {
        let txn = self.db.begin().await?;
        let now = Utc::now();
        let state = if reroute {
            LeadState::Received
        } else {
            LeadState::Unsold
        };
        let changed = transition(lead_id, &[LeadState::Sold.as_str()], state.as_str())
            .col_expr(lead::Column::HistoryFrom, Expr::value(now))
            .col_expr(lead::Column::OfferTried, Expr::value(false))
            .exec(&txn)
            .await?
            .rows_affected;
        if changed == 0 {
            drop(txn);
            return self
                .after_change(lead_id, 0, "only a sold lead can be returned")
                .await;
        }
        let returned = sale::Entity::find()
            .filter(sale::Column::LeadId.eq(lead_id))
            .filter(sale::Column::ReturnedAt.is_null())
            .all(&txn)
            .await?;
        for sale in &returned {
            if let Some(post) = &sale.attempt_id {
                if let Some(post) = attempt::Entity::find_by_id(post.clone()).one(&txn).await? {
                    caps::release(&txn, &caps::slots_of_post(&txn, &post).await?).await?;
                }
            }
        }
        sale::Entity::update_many()
            .col_expr(sale::Column::ReturnedAt, Expr::value(now))
            .col_expr(sale::Column::ReturnReason, Expr::value(reason))
            .filter(sale::Column::LeadId.eq(lead_id))
            .filter(sale::Column::ReturnedAt.is_null())
            .exec(&txn)
            .await?;
        txn.commit().await?;
        self.after_change(lead_id, 1, "").await
    }

    pub async fn find_attempt(&self, attempt_id: &str) -> Result<Option<attempt::Model>, DbErr> {
        attempt::Entity::find_by_id(attempt_id.to_string())
            .one(&self.db)
            .await
    }

    /// Alerts, newest first.
    pub async fn recent_alerts(&self, limit: u64) -> Result<Vec<alert::Model>, DbErr> {
        alert::Entity::find()
            .order_by_desc(alert::Column::CreatedAt)
            .order_by_desc(alert::Column::Id)
            .limit(limit)
            .all(&self.db)
            .await
    }

    /// The lead after a conditional change; `changed == 0` means its state
    /// did not allow it (or it does not exist).
    pub(super) async fn after_change(
        &self,
        lead_id: &str,
        changed: u64,
        refusal: &str,
    ) -> Result<lead::Model, OperationError> {
        let row = self
            .find_lead(lead_id)
            .await?
            .ok_or(OperationError::NotFound)?;
        if changed == 0 {
            return Err(OperationError::Conflict(format!(
                "{refusal}; this one is {}",
                row.state
            )));
        }
        Ok(row)
    }
}

/// `UPDATE leads SET state = to WHERE id = lead_id AND state IN from`:
/// every change here is one, so it wins only from the state it expects.
pub(super) fn transition(
    lead_id: &str,
    from: &[&str],
    to: &str,
) -> sea_orm::UpdateMany<lead::Entity> {
    lead::Entity::update_many()
        .col_expr(lead::Column::State, Expr::value(to))
        .col_expr(lead::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(lead::Column::Id.eq(lead_id))
        .filter(lead::Column::State.is_in(from.iter().copied()))
}

/// Which of a lead's unanswered posts give their cap slots back.
#[derive(Debug, Clone, Copy)]
pub(super) enum GiveBack<'a> {
    /// Every one: the lead did not sell to any of them.
    All,
    /// Every one but the newest to this buyer: the sale an operator
    /// records is its (the others did not sell: one sale per lead).
    AllButTheSaleOf(&'a str),
    /// This buyer's: a later post to it sold, holding a slot of its own.
    OfBuyer(&'a str),
}

/// Gives back the cap slots of the lead's posts in its current history
/// that got no answer (timed out, or interrupted), as `which` says: each
/// kept them in case it sold. Answers the id of the post kept for a sale.
/// A transaction given as `db` must have written already: on SQLite one
/// that reads first cannot write once another connection has committed.
pub(super) async fn release_unanswered_posts(
    db: &impl ConnectionTrait,
    lead_id: &str,
    which: GiveBack<'_>,
) -> Result<Option<String>, DbErr> {
    let history_from = lead::Entity::find_by_id(lead_id)
        .one(db)
        .await?
        .and_then(|row| row.history_from);
    let timeout = AttemptOutcome::Call(CallOutcome::Timeout);
    let mut posts = attempt::Entity::find()
        .filter(attempt::Column::LeadId.eq(lead_id))
        .filter(attempt::Column::Kind.eq(AttemptKind::POST.as_str()))
        .filter(attempt::Column::Outcome.eq(timeout.as_str()));
    if let Some(from) = history_from {
        posts = posts.filter(attempt::Column::StartedAt.gte(from));
    }
    let posts = posts
        .order_by_desc(attempt::Column::StartedAt)
        .all(db)
        .await?;
    let kept = match which {
        GiveBack::AllButTheSaleOf(buyer) => posts.iter().find(|post| post.buyer_id == buyer),
        GiveBack::All | GiveBack::OfBuyer(_) => None,
    };
    for post in &posts {
        let gives_back = match which {
            GiveBack::OfBuyer(buyer) => post.buyer_id == buyer,
            GiveBack::All | GiveBack::AllButTheSaleOf(_) => {
                kept.is_none_or(|kept| kept.id != post.id)
            }
        };
        if gives_back {
            caps::release(db, &caps::slots_of_post(db, post).await?).await?;
        }
    }
    Ok(kept.map(|post| post.id.clone()))
}

/// A new routing history for the lead from now (an operator's settlement):
/// buyers posted to before are offered it again only if `include_tried`.
pub(super) fn new_history(lead_id: &str, include_tried: bool) -> sea_orm::UpdateMany<lead::Entity> {
    lead::Entity::update_many()
        .col_expr(lead::Column::HistoryFrom, Expr::value(Utc::now()))
        .col_expr(lead::Column::OfferTried, Expr::value(include_tried))
        .filter(lead::Column::Id.eq(lead_id))
}

/// A sale row (not returned).
pub(super) fn new_sale(
    lead_id: &str,
    buyer_id: &str,
    attempt_id: Option<String>,
    price: Option<f64>,
    payout: Option<f64>,
) -> sale::ActiveModel {
    sale::ActiveModel {
        id: Set(new_id()),
        lead_id: Set(lead_id.into()),
        buyer_id: Set(buyer_id.into()),
        attempt_id: Set(attempt_id),
        price: Set(price),
        sold_at: Set(Utc::now()),
        returned_at: Set(None),
        return_reason: Set(None),
        payout: Set(payout),
    }
}
