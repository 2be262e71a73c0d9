//! A keyed lead's (source, key) pair is unique through its id, derived
//! from the pair: the unique index of key digests goes, and with it one
//! random-order index write per lead. The digests already stored stay, in a
//! partial index, for leads stored before ids were derived (their ids are
//! random; a replay of their keys is found by digest). New leads store no
//! digest. `person_keys_lead_id` goes too: a derived id puts each new entry
//! on a random page, and the one query that used it (a duplicate giving
//! back its values) names the values it gives back.

use sea_orm_migration::prelude::*;

const UNIQUE_DIGEST: &str = "leads_source_key_digest";
const EARLIER_DIGESTS: &str = "leads_earlier_key_digest";
const PERSON_KEYS_LEAD: &str = "person_keys_lead_id";

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
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
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
