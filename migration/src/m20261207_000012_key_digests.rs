//! The unique index of (source, idempotency key) holds a fixed-length
//! digest of the pair (`entity::lead::key_digest`) instead of the key
//! itself: PostgreSQL's btree refuses an index row above about 2,700
//! bytes, so a long `Idempotency-Key` was answered 503 on every try. The
//! full key stays in `idempotency_key`, and replays compare it. Leads
//! stored before get their digest here. Lead lists page by arrival time
//! (a keyed lead's id is derived from its key, so ids no longer sort by
//! arrival): `leads (received_at, id)` serves them.

use entity::lead::key_digest;
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

/// Leads given their digest per statement while upgrading.
const BACKFILL_CHUNK: u64 = 500;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Leads::Table)
                    .add_column(ColumnDef::new(Leads::KeyDigest).string().null())
                    .to_owned(),
            )
            .await?;
        backfill(manager).await?;
        manager
            .create_index(
                Index::create()
                    .name("leads_source_key_digest")
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
                    .name("leads_source_idempotency_key")
                    .table(Leads::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("leads_received_at_id")
                    .table(Leads::Table)
                    .col(Leads::ReceivedAt)
                    .col(Leads::Id)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("leads_received_at_id")
                    .table(Leads::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("leads_source_idempotency_key")
                    .table(Leads::Table)
                    .col(Leads::SourceId)
                    .col(Leads::IdempotencyKey)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("leads_source_key_digest")
                    .table(Leads::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Leads::Table)
                    .drop_column(Leads::KeyDigest)
                    .to_owned(),
            )
            .await
    }
}

/// Gives every keyed lead stored before this migration its digest.
async fn backfill(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = manager.get_database_backend();
    loop {
        let select = Query::select()
            .columns([Leads::Id, Leads::SourceId, Leads::IdempotencyKey])
            .from(Leads::Table)
            .and_where(Expr::col(Leads::IdempotencyKey).is_not_null())
            .and_where(Expr::col(Leads::KeyDigest).is_null())
            .limit(BACKFILL_CHUNK)
            .to_owned();
        let rows = db.query_all_raw(backend.build(&select)).await?;
        if rows.is_empty() {
            return Ok(());
        }
        for row in rows {
            let id: String = row.try_get("", "id")?;
            let source: String = row.try_get("", "source_id")?;
            let key: String = row.try_get("", "idempotency_key")?;
            let update = Query::update()
                .table(Leads::Table)
                .value(Leads::KeyDigest, key_digest(&source, &key))
                .and_where(Expr::col(Leads::Id).eq(id))
                .to_owned();
            db.execute_raw(backend.build(&update)).await?;
        }
    }
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    Id,
    SourceId,
    IdempotencyKey,
    KeyDigest,
    ReceivedAt,
}
