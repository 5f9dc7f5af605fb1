//! `lode crypt`: directory trees encrypted on the client, under master keys the servers never
//! see (fscrypt's `fscrypt encrypt`, `unlock`, `lock` and `status`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Subcommand;
use client::crypt::{keyring, MasterKey};
use client::Client;

#[derive(Subcommand)]
pub enum CryptCmd {
    /// Encrypt everything made below an empty directory under the key in KEY_FILE (64 random
    /// bytes: `head -c 64 /dev/urandom > KEY_FILE`); the key is unlocked here too.
    Set {
        dir: String,
        #[arg(long)]
        key_file: PathBuf,
    },
    /// Give this node's processes of your user the key of an encrypted directory (the kernel
    /// keyring): its names and contents read and written in clear.
    Unlock {
        dir: String,
        #[arg(long)]
        key_file: PathBuf,
    },
    /// Take the key of an encrypted directory out of the keyring.
    Lock { dir: String },
    /// Whether a directory is encrypted, under which key, and whether it is unlocked here.
    Status { dir: String },
}

fn key(path: &std::path::Path) -> Result<MasterKey> {
    Ok(MasterKey::read_file(path)?)
}

pub async fn run(client: &Client, cmd: CryptCmd) -> Result<()> {
    match cmd {
        CryptCmd::Set { dir, key_file } => {
            let k = key(&key_file)?;
            let p = client.crypt_set(&dir, &k).await?;
            keyring::add(&k)?;
            out!("{dir}: encrypted under key {} (unlocked)", p.key_hex());
        }
        CryptCmd::Unlock { dir, key_file } => {
            let k = key(&key_file)?;
            let Some(p) = client.crypt_policy(&dir).await? else {
                bail!("{dir}: not encrypted");
            };
            if !k.unlocks(&p) {
                bail!(
                    "{dir}: the key in {} is not the directory's ({})",
                    key_file.display(),
                    p.key_hex()
                );
            }
            keyring::add(&k)?;
            out!("{dir}: unlocked (key {})", p.key_hex());
        }
        CryptCmd::Lock { dir } => {
            let Some(p) = client.crypt_policy(&dir).await? else {
                bail!("{dir}: not encrypted");
            };
            if !keyring::remove(&p.key_id)? {
                bail!("{dir}: key {} is not unlocked here", p.key_hex());
            }
            out!("{dir}: locked (key {})", p.key_hex());
        }
        CryptCmd::Status { dir } => match client.crypt_policy(&dir).await? {
            None => out!("{dir}: not encrypted"),
            Some(p) => {
                let unlocked = client.crypt_unlocked(&p)?;
                out!(
                    "{dir}: encrypted\n  key:       {}\n  contents:  AES-256-XTS, units of {} bytes\n  names:     AES-256-GCM-SIV\n  unlocked:  {}",
                    p.key_hex(),
                    proto::crypt::UNIT,
                    if unlocked { "yes" } else { "no" }
                );
            }
        },
    }
    Ok(())
}
