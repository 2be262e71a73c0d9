//! The spool: a durable local journal for leads that arrive while the
//! database is unreachable (`intake.spool_dir`).
//!
//! Intake writes each such batch as one journal file (written to a
//! temporary name, fsynced, renamed, and the directory fsynced) before the
//! senders are answered `pending`. The `SpoolDrainer` actor moves the files
//! into the database, oldest first, once it answers, then deletes them.
//! While a lead is spooled, its (source, key) and its id answer from the
//! in-memory index here, so a replay gets the spooled contract. Once a batch
//! found the database unreachable, intake spools without trying it again
//! until the drainer has reached it (`database_down`), so an outage costs
//! senders the acquire timeout once, not on every batch. At start the
//! index is rebuilt from the files left by an earlier run. A directory that
//! cannot be created is reported (log, `/readyz`), not fatal.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use crate::domain::{new_id, Contract};
use crate::store::NewLead;

const JOURNAL_EXTENSION: &str = "jsonl";

/// One line of a journal file: the lead and what its sender was told.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpooledLead {
    pub lead: NewLead,
    pub contract: Contract,
}

/// A spooled lead the database refused, kept in `refused/` for an operator
/// (see `Spool::set_aside`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefusedLead {
    #[serde(flatten)]
    pub spooled: SpooledLead,
    /// What the database said.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub refused_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Handle on the spool directory and its index; cheap to clone.
#[derive(Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Why the spool cannot take leads, if it cannot.
    problem: Mutex<Option<String>>,
    by_key: DashMap<(String, String), Contract>,
    by_id: DashMap<String, Contract>,
    pending: AtomicUsize,
    database_down: AtomicBool,
}

impl Spool {
    /// Opens (creating) the directory and indexes the journal files in it.
    pub fn open(dir: &Path) -> Self {
        let spool = Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                problem: Mutex::new(None),
                by_key: DashMap::new(),
                by_id: DashMap::new(),
                pending: AtomicUsize::new(0),
                database_down: AtomicBool::new(false),
            }),
        };
        if let Err(error) = fs::create_dir_all(dir) {
            let problem = format!("spool directory {} unusable: {error}", dir.display());
            tracing::error!("{problem}; leads cannot be spooled while the database is down");
            *spool.lock_problem() = Some(problem);
            return spool;
        }
        match spool.journals() {
            Ok(files) => {
                for file in files {
                    match read_journal(&file) {
                        Ok(leads) => spool.index(&leads),
                        Err(error) => {
                            tracing::error!(%error, file = %file.display(), "unreadable spool journal left as it is")
                        }
                    }
                }
            }
            Err(error) => tracing::error!(%error, "cannot list the spool directory"),
        }
        let pending = spool.pending();
        if pending > 0 {
            tracing::warn!(pending, "leads from an earlier run wait in the spool");
        }
        spool
    }

    /// Journals the leads durably (fsync) before their senders are answered.
    /// Blocking file I/O: run it off the async threads.
    pub fn append(&self, leads: &[SpooledLead]) -> io::Result<()> {
        if let Some(problem) = self.problem() {
            return Err(io::Error::other(problem));
        }
        let name = new_id();
        let temporary = self.inner.dir.join(format!("{name}.tmp"));
        let journal = self.inner.dir.join(format!("{name}.{JOURNAL_EXTENSION}"));
        let mut file = File::create(&temporary)?;
        for lead in leads {
            serde_json::to_writer(&mut file, lead)?;
            file.write_all(b"\n")?;
        }
        file.sync_all()?;
        // Indexed before the journal is visible, so the drainer never
        // removes entries that are not indexed yet.
        self.index(leads);
        let renamed = fs::rename(&temporary, &journal).and_then(|()| self.sync_dir());
        if let Err(error) = renamed {
            self.forget(leads);
            let _ = fs::remove_file(&temporary);
            return Err(error);
        }
        Ok(())
    }

    /// The contract of a spooled lead with this source and key (a replay).
    pub fn replay_of(&self, source: &str, key: &str) -> Option<Contract> {
        let found = self
            .inner
            .by_key
            .get(&(source.to_string(), key.to_string()))?;
        let mut contract = found.clone();
        contract.replayed = true;
        Some(contract)
    }

    /// The contract of a spooled lead, by its id.
    pub fn contract_of(&self, lead_id: &str) -> Option<Contract> {
        self.inner.by_id.get(lead_id).map(|found| found.clone())
    }

    /// Leads waiting in the spool.
    pub fn pending(&self) -> usize {
        self.inner.pending.load(Ordering::Relaxed)
    }

    /// Intake found the database unreachable: spool without trying it.
    pub fn mark_database_down(&self) {
        self.inner.database_down.store(true, Ordering::Relaxed);
    }

    /// The drainer reached the database again.
    pub fn mark_database_up(&self) {
        self.inner.database_down.store(false, Ordering::Relaxed);
    }

    pub fn database_down(&self) -> bool {
        self.inner.database_down.load(Ordering::Relaxed)
    }

    /// Why the spool cannot take leads, if it cannot.
    pub fn problem(&self) -> Option<String> {
        self.lock_problem().clone()
    }

    /// Journal files, oldest first (names are UUIDv7s).
    pub fn journals(&self) -> io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.inner.dir)?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == JOURNAL_EXTENSION))
            .collect();
        files.sort();
        Ok(files)
    }

    /// Deletes a journal whose leads are now in the database, and forgets them.
    pub fn remove(&self, journal: &Path, leads: &[SpooledLead]) -> io::Result<()> {
        fs::remove_file(journal)?;
        self.sync_dir()?;
        self.forget(leads);
        Ok(())
    }

    /// Keeps a spooled lead the database refused in `refused/`, for an
    /// operator: it is never dropped, its id keeps answering (`pending`),
    /// and it can be imported again once the cause is fixed.
    pub fn set_aside(&self, refused: &SpooledLead, reason: &str) -> io::Result<()> {
        let dir = self.refused_dir();
        fs::create_dir_all(&dir)?;
        let kept = RefusedLead {
            spooled: refused.clone(),
            reason: reason.to_string(),
            refused_at: Some(chrono::Utc::now()),
        };
        let mut file = File::create(dir.join(format!("{}.json", refused.lead.id)))?;
        serde_json::to_writer(&mut file, &kept)?;
        file.sync_all()?;
        File::open(&dir)?.sync_all()
    }

    /// Every refused lead, oldest first.
    pub fn refused(&self) -> io::Result<Vec<RefusedLead>> {
        let mut paths: Vec<PathBuf> = match fs::read_dir(self.refused_dir()) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .collect(),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        paths.retain(|path| path.extension().is_some_and(|ext| ext == "json"));
        paths.sort();
        paths.iter().map(|path| read_refused(path)).collect()
    }

    /// The refused lead with this id, if there is one.
    pub fn refused_lead(&self, lead_id: &str) -> io::Result<Option<RefusedLead>> {
        // Ids are UUIDs: nothing else names a file.
        if lead_id.is_empty()
            || !lead_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Ok(None);
        }
        let path = self.refused_dir().join(format!("{lead_id}.json"));
        match read_refused(&path) {
            Ok(refused) => Ok(Some(refused)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Forgets a refused lead once it is in the database.
    pub fn remove_refused(&self, lead_id: &str) -> io::Result<()> {
        let dir = self.refused_dir();
        fs::remove_file(dir.join(format!("{lead_id}.json")))?;
        File::open(&dir)?.sync_all()
    }

    fn refused_dir(&self) -> PathBuf {
        self.inner.dir.join("refused")
    }

    fn forget(&self, leads: &[SpooledLead]) {
        for spooled in leads {
            if self.inner.by_id.remove(&spooled.lead.id).is_some() {
                self.inner.pending.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some(key) = key_of(&spooled.lead) {
                self.inner.by_key.remove(&key);
            }
        }
    }

    fn index(&self, leads: &[SpooledLead]) {
        for spooled in leads {
            let fresh = self
                .inner
                .by_id
                .insert(spooled.lead.id.clone(), spooled.contract.clone())
                .is_none();
            if fresh {
                self.inner.pending.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(key) = key_of(&spooled.lead) {
                self.inner.by_key.insert(key, spooled.contract.clone());
            }
        }
    }

    /// Makes a create, rename or delete in the directory durable.
    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.inner.dir)?.sync_all()
    }

    fn lock_problem(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.inner
            .problem
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

fn read_refused(path: &Path) -> io::Result<RefusedLead> {
    Ok(serde_json::from_reader(BufReader::new(File::open(path)?))?)
}

/// Reads one journal file.
pub fn read_journal(path: &Path) -> io::Result<Vec<SpooledLead>> {
    BufReader::new(File::open(path)?)
        .lines()
        .filter(|line| !matches!(line, Ok(text) if text.trim().is_empty()))
        .map(|line| Ok(serde_json::from_str(&line?)?))
        .collect()
}

fn key_of(lead: &NewLead) -> Option<(String, String)> {
    lead.idempotency_key
        .as_ref()
        .map(|key| (lead.source_id.clone(), key.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::FieldError;

    fn lead(id: &str, key: Option<&str>) -> SpooledLead {
        SpooledLead {
            lead: NewLead {
                id: id.into(),
                source_id: "partner".into(),
                idempotency_key: key.map(str::to_string),
                external_id: None,
                raw: vec![0xff, b'{', b'}'],
                raw_content_type: "application/json".into(),
                remote_ip: None,
                fields: Default::default(),
                attribution: Default::default(),
                is_test: false,
                errors: vec![FieldError::new("email", "missing")],
                received_at: chrono::Utc::now(),
                accept_on_store: true,
            },
            contract: Contract::spooled(id.into(), vec![]),
        }
    }

    #[test]
    fn a_journal_survives_a_restart_and_is_forgotten_once_removed() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path());
        spool
            .append(&[lead("a", Some("k1")), lead("b", None)])
            .unwrap();
        assert_eq!(spool.pending(), 2);

        let reopened = Spool::open(dir.path());
        assert_eq!(reopened.pending(), 2);
        let replay = reopened.replay_of("partner", "k1").unwrap();
        assert!(replay.replayed);
        assert_eq!(replay.submission_id, "a");
        let journals = reopened.journals().unwrap();
        assert_eq!(journals.len(), 1);
        let leads = read_journal(&journals[0]).unwrap();
        assert_eq!(
            leads[0].lead.raw,
            vec![0xff, b'{', b'}'],
            "raw bytes kept exactly"
        );

        reopened.remove(&journals[0], &leads).unwrap();
        assert_eq!(reopened.pending(), 0);
        assert!(reopened.replay_of("partner", "k1").is_none());
        assert!(reopened.contract_of("b").is_none());
        assert!(Spool::open(dir.path()).journals().unwrap().is_empty());
    }

    #[test]
    fn an_unusable_directory_is_reported_not_fatal() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let spool = Spool::open(&file.path().join("spool"));
        assert!(spool.problem().is_some());
        assert!(spool.append(&[lead("a", None)]).is_err());
    }
}
