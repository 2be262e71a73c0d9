//! A keyed lead's (source, key) pair is unique through its id, derived
//! from the pair: the unique index of key digests goes, and with it one
//! random-order index write per lead. The digests already stored stay, in a
//! partial index, for leads stored before ids were derived (their ids are
//! random; a replay of their keys is found by digest). New leads store no
//! digest. Two indexes by lead id go too, each a random-order write per
//! lead now that keyed ids are digests: `person_keys_lead_id` (the one query
//! that used it, a duplicate giving back its values, names the values) and
//! `intake_log_lead_id` (the arrival journal is appended to and never read
//! by lead in the service; its rows stay in arrival order, by `id`).
//! Together with the digests' index they cost SQLite intake over HTTP a
//! third of its leads/s.

use sea_orm_migration::prelude::*;

const UNIQUE_DIGEST: &str = "leads_source_key_digest";
const EARLIER_DIGESTS: &str = "leads_earlier_key_digest";
const PERSON_KEYS_LEAD: &str = "person_keys_lead_id";
const INTAKE_LOG_LEAD: &str = "intake_log_lead_id";

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(EARLIER_DIGESTS)
                    .table(Leads::Table)
                    .col(Leads::SourceId)
                    .col(Leads::KeyDigest)
                    .and_where(Expr::col(Leads::KeyDigest).is_not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(UNIQUE_DIGEST)
                    .table(Leads::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(PERSON_KEYS_LEAD)
                    .table(PersonKeys::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(INTAKE_LOG_LEAD)
                    .table(IntakeLog::Table)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(INTAKE_LOG_LEAD)
                    .table(IntakeLog::Table)
                    .col(IntakeLog::LeadId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(PERSON_KEYS_LEAD)
                    .table(PersonKeys::Table)
                    .col(PersonKeys::LeadId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(UNIQUE_DIGEST)
                    .table(Leads::Table)
                    .col(Leads::SourceId)
                    .col(Leads::KeyDigest)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(EARLIER_DIGESTS)
                    .table(Leads::Table)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    SourceId,
    KeyDigest,
}

#[derive(DeriveIden)]
enum PersonKeys {
    Table,
    LeadId,
}

#[derive(DeriveIden)]
enum IntakeLog {
    Table,
    LeadId,
}
