//! Layouts as `lfs setstripe` arguments: `-c N -S SIZE [-i IDX]`, or components
//! `-E END -c N -S SIZE ... -E -1 ...` (a first component `-E END -L mdt` keeps the file's
//! first bytes on the MDS), with `-N COPIES` for a mirrored file. The `lode` command parses them; the mount shows and
//! takes them as the `lode.layout` extended attribute.

use proto::layout::{Component, Layout, StripeCount, DEFAULT_STRIPE_SIZE, EOF};
use proto::FsErrorKind;

use crate::error::{ClientError, Result};

fn bad(what: String) -> ClientError {
    ClientError::fs(FsErrorKind::Invalid, what)
}

/// Parses a size with [`proto::size::parse_size`]'s units (4M, 64k, 1.5G, 16GB, 1048576).
pub fn parse_size(s: &str) -> Result<u64> {
    proto::size::parse_size(s).map_err(|e| bad(e.to_string()))
}

/// Parses the options (without the path) into a layout.
pub fn parse(opts: &[String]) -> Result<Layout> {
    let mut comps: Vec<Component> = vec![];
    let mut cur = Component::raid0(StripeCount::Count(1), DEFAULT_STRIPE_SIZE);
    let mut cur_end: Option<u64> = None;
    let mut started = false;
    let mut mirrors = 1u16;
    let mut it = opts.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| bad(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "-E" | "--component-end" => {
                if started {
                    cur.end = cur_end.unwrap_or(EOF);
                    comps.push(finish(cur.clone()));
                    cur.start = cur.end;
                    if cur.on_mdt() {
                        // What follows the MDS's part is striped, as in Lustre.
                        cur.stripe_count = StripeCount::Count(1);
                        cur.stripe_size = DEFAULT_STRIPE_SIZE;
                    }
                }
                started = true;
                let v = value()?;
                cur_end = Some(if v == "-1" || v.eq_ignore_ascii_case("eof") {
                    EOF
                } else {
                    parse_size(v)?
                });
            }
            "-c" | "--stripe-count" => {
                let v = value()?;
                cur.stripe_count = if v == "-1" {
                    StripeCount::All
                } else {
                    StripeCount::Count(
                        v.parse()
                            .map_err(|_| bad(format!("bad stripe count {v:?}")))?,
                    )
                };
            }
            "-S" | "--stripe-size" => cur.stripe_size = parse_size(value()?)?,
            "-L" | "--layout" => match value()?.as_str() {
                "mdt" => cur.stripe_count = StripeCount::Mdt,
                "raid0" => {
                    if cur.on_mdt() {
                        cur.stripe_count = StripeCount::Count(1);
                    }
                }
                v => return Err(bad(format!("unknown layout pattern {v:?} (mdt or raid0)"))),
            },
            "-i" | "--stripe-index" => {
                let v = value()?;
                cur.stripe_offset = Some(
                    v.parse()
                        .map_err(|_| bad(format!("bad stripe index {v:?}")))?,
                );
            }
            "-N" | "--mirror-count" => {
                let v = value()?;
                mirrors = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=proto::layout::MAX_MIRRORS).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "bad mirror count {v:?} (1 to {})",
                            proto::layout::MAX_MIRRORS
                        ))
                    })?;
            }
            other => return Err(bad(format!("unknown setstripe option {other:?}"))),
        }
    }
    cur.end = cur_end.unwrap_or(EOF);
    comps.push(finish(cur));
    Ok(Layout::new(comps)?.with_mirrors(mirrors)?)
}

/// A Data-on-MDT component's stripe size is its end, as `lfs` sets it.
fn finish(mut c: Component) -> Component {
    if c.on_mdt() {
        c.stripe_size = c.end;
    }
    c
}

/// A layout as the options that make it (objects left out).
pub fn format(l: &Layout) -> String {
    let copies = l.mirror_count();
    let l = l.mirror(0);
    let multi = l.components.len() > 1;
    let mut out = vec![];
    if copies > 1 {
        out.push("-N".to_string());
        out.push(copies.to_string());
    }
    for c in &l.components {
        if multi {
            out.push("-E".into());
            out.push(if c.end == EOF {
                "-1".into()
            } else {
                c.end.to_string()
            });
        }
        if c.on_mdt() {
            out.push("-L".into());
            out.push("mdt".into());
            continue;
        }
        out.push("-c".into());
        out.push(match c.stripe_count {
            StripeCount::All => "-1".into(),
            StripeCount::Count(n) => n.to_string(),
            StripeCount::Mdt => unreachable!("handled above"),
        });
        out.push("-S".into());
        out.push(c.stripe_size.to_string());
        if let Some(i) = c.stripe_offset {
            out.push("-i".into());
            out.push(i.to_string());
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn plain_and_progressive_layouts_parse_and_print_back() {
        let l = parse(&args("-c 4 -S 1M")).unwrap();
        assert_eq!(
            (l.components[0].stripe_count, l.components[0].stripe_size),
            (StripeCount::Count(4), 1 << 20)
        );
        assert_eq!(format(&l), "-c 4 -S 1048576");
        let l = parse(&args("-E 4M -c 1 -E 64M -c 4 -E -1 -c -1")).unwrap();
        let ends: Vec<u64> = l.components.iter().map(|c| c.end).collect();
        assert_eq!(ends, vec![4 << 20, 64 << 20, EOF]);
        assert_eq!(parse(&args(&format(&l))).unwrap().components, l.components);
        assert!(
            parse(&args("-S 1000")).is_err(),
            "a stripe size not a multiple of 64 KiB"
        );
        assert!(parse(&args("-x 3")).is_err());
        let m = parse(&args("-N 2 -c 2 -S 1M")).unwrap();
        assert_eq!(m.mirror_count(), 2);
        assert_eq!(format(&m), "-N 2 -c 2 -S 1048576");
        assert_eq!(parse(&args(&format(&m))).unwrap(), m);
        assert!(parse(&args("-N 9")).is_err(), "more mirrors than allowed");
        assert!(parse(&args("-c")).is_err());
    }

    #[test]
    fn a_first_component_on_the_mds_parses_and_prints_back() {
        let l = parse(&args("-E 64K -L mdt -E -1 -c -1")).unwrap();
        assert_eq!(l.mdt_end(), Some(64 << 10));
        assert_eq!(l.components[0].stripe_size, 64 << 10);
        assert_eq!(l.components[1].stripe_count, StripeCount::All);
        assert_eq!(l.components[1].stripe_size, DEFAULT_STRIPE_SIZE);
        assert_eq!(format(&l), "-E 65536 -L mdt -E -1 -c -1 -S 4194304");
        assert_eq!(parse(&args(&format(&l))).unwrap(), l);
        // The rest after an MDS part is striped even with no -c of its own.
        let l = parse(&args("-E 1M -L mdt -E -1")).unwrap();
        assert_eq!(l.components[1].stripe_count, StripeCount::Count(1));
        assert!(
            parse(&args("-E 2M -L mdt -E -1")).is_err(),
            "past the MDS's limit"
        );
        assert!(
            parse(&args("-E 1M -c 1 -E 2M -L mdt -E -1")).is_err(),
            "not first"
        );
        assert!(parse(&args("-E 64K -L raid5")).is_err());
    }
}
