//! Building commands into batches of up to 64 with one `CMD_SYNC` (Linux
//! `arm_smmu_cmdq_batch_add` / `arm_smmu_cmdq_batch_submit`).

use super::cmdq::{validate, CmdqError, CmdqProducer};
use super::spec::Command;
use crate::work::WorkRecord;

/// Commands per batch (Linux `CMDQ_BATCH_ENTRIES`, one bitmap word).
pub const CMDQ_BATCH_ENTRIES: usize = 64;

/// Commands gathered for one issue. When the batch is full, [`CmdBatch::add`] issues it
/// without a sync and starts again; [`CmdBatch::submit`] issues the rest followed by one
/// `CMD_SYNC` and waits for it, which also covers every earlier flush of this batch (they
/// sit before the sync in the queue).
///
/// The batch holds at most [`CMDQ_BATCH_ENTRIES`] commands, and fewer on a queue too small
/// for a full batch plus its sync.
#[must_use = "the last commands of a batch are only issued by submit()"]
pub struct CmdBatch<'q, P: CmdqProducer + ?Sized> {
    q: &'q P,
    cmds: [Command; CMDQ_BATCH_ENTRIES],
    len: usize,
    limit: usize,
}

impl<'q, P: CmdqProducer + ?Sized> CmdBatch<'q, P> {
    /// An empty batch for `q`.
    pub fn new(q: &'q P) -> Self {
        let limit = CMDQ_BATCH_ENTRIES.min(q.cmdq().capacity() - 1).max(1);
        CmdBatch {
            q,
            cmds: [Command::TlbiNsnhAll; CMDQ_BATCH_ENTRIES],
            len: 0,
            limit,
        }
    }

    /// Commands gathered since the last flush.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no command is waiting.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many commands a flush holds.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Adds a command, first issuing the batch (without a sync) if it is full. A command
    /// that cannot be issued (a `CMD_SYNC`, a field out of range) is rejected here.
    pub fn add(&mut self, cmd: Command, work: &mut WorkRecord) -> Result<(), CmdqError> {
        validate(std::slice::from_ref(&cmd))
            .map(drop)
            .map_err(|e| match e {
                CmdqError::SyncInList { .. } => CmdqError::SyncInList { index: self.len },
                CmdqError::Encode { source, .. } => CmdqError::Encode {
                    index: self.len,
                    source,
                },
                other => other,
            })?;
        if self.len == self.limit {
            self.q.issue(&self.cmds[..self.len], false, work)?;
            self.len = 0;
        }
        self.cmds[self.len] = cmd;
        self.len += 1;
        Ok(())
    }

    /// Issues the remaining commands and one `CMD_SYNC`, and waits for the sync.
    pub fn submit(self, work: &mut WorkRecord) -> Result<(), CmdqError> {
        self.q.issue(&self.cmds[..self.len], true, work)
    }
}
