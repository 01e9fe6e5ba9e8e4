//! What UCX can use on this machine, and whether a UCX_TLS value asks for
//! something it cannot. UCX itself only warns (or fails with a bare "no such
//! device") when a requested transport is missing; an operator choosing
//! `tls = "rc,ud"` on a box without InfiniBand deserves an error that names
//! what was asked for and what there is instead.

use crate::sys;
use crate::{ucx_error, Error};
use std::os::raw::c_char;
use std::ptr;

/// One transport on one device, as UCT reports it (`ucx_info -d` shows the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportResource {
    pub transport: String,
    pub device: String,
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Lists every transport/device pair UCT finds, by opening each memory domain.
pub fn available_transports() -> Result<Vec<TransportResource>, Error> {
    let mut found = Vec::new();
    // SAFETY: plain UCT queries; every list obtained is released below and
    // arrays are sized from the counts UCT reports.
    unsafe {
        let mut components: *mut sys::uct_component_h = ptr::null_mut();
        let mut num_components: u32 = 0;
        let status = sys::uct_query_components(&mut components, &mut num_components);
        if status != sys::UCS_OK {
            return Err(ucx_error("uct_query_components", status));
        }
        for i in 0..num_components as usize {
            let component = *components.add(i);
            let mut attr = sys::uct_component_attr {
                field_mask: (sys::UCT_COMPONENT_ATTR_FIELD_NAME
                    | sys::UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT)
                    as u64,
                ..Default::default()
            };
            if sys::uct_component_query(component, &mut attr) != sys::UCS_OK {
                continue;
            }
            let mut mds =
                vec![sys::uct_md_resource_desc::default(); attr.md_resource_count as usize];
            attr.field_mask = sys::UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES as u64;
            attr.md_resources = mds.as_mut_ptr();
            if sys::uct_component_query(component, &mut attr) != sys::UCS_OK {
                continue;
            }
            for md_desc in &mds {
                found.extend(md_transports(component, md_desc));
            }
        }
        sys::uct_release_component_list(components);
    }
    Ok(found)
}

/// The transports of one memory domain (empty if it cannot be opened).
unsafe fn md_transports(
    component: sys::uct_component_h,
    md_desc: &sys::uct_md_resource_desc,
) -> Vec<TransportResource> {
    let mut out = Vec::new();
    let mut md_config: *mut sys::uct_md_config_t = ptr::null_mut();
    if sys::uct_md_config_read(component, ptr::null(), ptr::null(), &mut md_config) != sys::UCS_OK {
        return out;
    }
    let mut md: sys::uct_md_h = ptr::null_mut();
    let opened = sys::uct_md_open(component, md_desc.md_name.as_ptr(), md_config, &mut md);
    sys::uct_config_release(md_config as *mut _);
    if opened != sys::UCS_OK {
        return out;
    }
    let mut resources: *mut sys::uct_tl_resource_desc_t = ptr::null_mut();
    let mut count: u32 = 0;
    if sys::uct_md_query_tl_resources(md, &mut resources, &mut count) == sys::UCS_OK {
        for j in 0..count as usize {
            let r = &*resources.add(j);
            out.push(TransportResource {
                transport: c_chars_to_string(&r.tl_name),
                device: c_chars_to_string(&r.dev_name),
            });
        }
        sys::uct_release_tl_resource_list(resources);
    }
    sys::uct_md_close(md);
    out
}

/// "tcp (lo, eth0), posix (memory), ..." in UCT's order, one entry per transport.
pub fn describe(resources: &[TransportResource]) -> String {
    let mut names: Vec<(String, Vec<String>)> = Vec::new();
    for r in resources {
        match names.iter_mut().find(|(t, _)| *t == r.transport) {
            Some((_, devices)) => devices.push(r.device.clone()),
            None => names.push((r.transport.clone(), vec![r.device.clone()])),
        }
    }
    if names.is_empty() {
        return "none".to_string();
    }
    names
        .iter()
        .map(|(t, d)| format!("{t} ({})", d.join(", ")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The concrete transports a UCX_TLS word stands for (UCX's documented
/// aliases); a plain transport name stands for itself.
fn expand_alias(word: &str) -> Vec<&str> {
    match word {
        "sm" | "shm" => vec!["posix", "sysv", "xpmem", "knem", "cma"],
        "ib" => vec!["rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5", "dc_mlx5"],
        "rc" => vec!["rc_verbs", "rc_mlx5"],
        "rc_v" => vec!["rc_verbs"],
        "rc_x" => vec!["rc_mlx5"],
        "ud" => vec!["ud_verbs", "ud_mlx5"],
        "ud_v" => vec!["ud_verbs"],
        "ud_x" => vec!["ud_mlx5"],
        "dc" | "dc_x" => vec!["dc_mlx5"],
        "cuda" => vec!["cuda_copy", "cuda_ipc", "gdr_copy"],
        "rocm" => vec!["rocm_copy", "rocm_ipc", "rocm_gdr"],
        "mm" => vec!["posix", "sysv", "xpmem"],
        other => vec![other],
    }
}

/// Checks a UCX_TLS value against what is available: every word must stand
/// for at least one available transport ("all" and exclusions `^...` always
/// pass). The error names the first word that does not.
pub fn check_tls(tls: &str, available: &[TransportResource]) -> Result<(), Error> {
    let words: Vec<&str> = tls.split(',').map(str::trim).collect();
    if words.iter().all(|w| w.is_empty()) {
        return Err(Error::Config(
            "UCX transport list (tls) is empty; leave it unset for UCX's own choice".into(),
        ));
    }
    for word in words {
        if word.is_empty() {
            return Err(Error::Config(format!(
                "UCX transport list `{tls}` has an empty entry"
            )));
        }
        if word == "all" || word.starts_with('^') {
            continue;
        }
        // "tcp:aux" style qualifiers name the same transport.
        let name = word.split(':').next().unwrap_or(word);
        let present = expand_alias(name)
            .iter()
            .any(|t| available.iter().any(|r| r.transport == *t));
        if !present {
            return Err(Error::Unavailable(format!(
                "UCX transport `{word}` (requested in UCX_TLS={tls}) is not available on this machine; available: {}",
                describe(available)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(t: &str, d: &str) -> TransportResource {
        TransportResource {
            transport: t.into(),
            device: d.into(),
        }
    }

    #[test]
    fn aliases_and_missing_words() {
        let avail = vec![
            res("tcp", "lo"),
            res("tcp", "eth0"),
            res("posix", "memory"),
            res("self", "memory0"),
        ];
        assert!(check_tls("tcp", &avail).is_ok());
        assert!(check_tls("sm,self", &avail).is_ok());
        assert!(check_tls("all", &avail).is_ok());
        assert!(check_tls("^rc,tcp", &avail).is_ok());
        let err = check_tls("tcp,rc", &avail).unwrap_err().to_string();
        assert!(err.contains("`rc`"), "{err}");
        assert!(
            err.contains("tcp (lo, eth0), posix (memory), self (memory0)"),
            "{err}"
        );
        assert!(check_tls("tcp,,self", &avail).is_err());
        assert!(check_tls("", &avail).is_err());
    }
}
