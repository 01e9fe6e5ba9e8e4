//! Reading an event store batch by batch: every object under a directory
//! or an S3 prefix, in listing order, each verified whole
//! (docs/store.md: checksums, lengths, its name against its header)
//! before it is handed out. A bad object is reported, named, and the
//! reading goes on with the next.

use evb_store::{ReadOptions, StoreObjects, StoreTarget, StoredObject};

/// One step of a read: a verified object, or a bad one and why.
pub enum Read {
    Good { name: String, object: StoredObject },
    Bad { name: String, reason: String },
}

/// A store being read, batch by batch.
pub struct StoreReader {
    objects: StoreObjects,
    target: String,
}

impl StoreReader {
    /// Lists `target` (a directory, an object file, or
    /// `s3://bucket/prefix?endpoint=...`; S3 credentials from the
    /// environment). Objects over `max_object_bytes` are reported bad
    /// without being read (0: the default, 4 GiB).
    pub fn open(target: &str, max_object_bytes: u64) -> Result<StoreReader, String> {
        let parsed = StoreTarget::parse(target).map_err(|e| e.to_string())?;
        let mut options = ReadOptions::default();
        if max_object_bytes > 0 {
            options.max_object_bytes = max_object_bytes;
        }
        let objects = StoreObjects::open(&parsed, &options).map_err(|e| e.to_string())?;
        Ok(StoreReader {
            objects,
            target: parsed.to_string(),
        })
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// Objects not read yet.
    pub fn remaining(&self) -> usize {
        self.objects.remaining()
    }

    /// Files under the target that are not objects (skipped).
    pub fn other_files(&self) -> u64 {
        self.objects.other_files()
    }
}

impl Iterator for StoreReader {
    type Item = Read;

    fn next(&mut self) -> Option<Read> {
        let (name, bytes) = self.objects.next()?;
        let verified =
            bytes.and_then(|b| StoredObject::verified(b, |b| evb_store::verify(&name, b)));
        Some(match verified {
            Ok(object) => Read::Good { name, object },
            Err(reason) => Read::Bad { name, reason },
        })
    }
}
