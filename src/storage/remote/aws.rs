//! The AWS shared config and credentials files, read as the AWS CLI and SDKs read them, for
//! what `object_store`'s `AmazonS3Builder::from_env` leaves out: profiles (`AWS_PROFILE`),
//! `~/.aws/config` (`AWS_CONFIG_FILE`) and `~/.aws/credentials`
//! (`AWS_SHARED_CREDENTIALS_FILE`): region, endpoint_url (also per service in a
//! `[services NAME]` section and the profile's `s3 =` sub-properties), addressing_style, and
//! static keys. Role assumption (`role_arn` + `source_profile`), SSO and `credential_process`
//! are refused with a clear message rather than silently skipped.
//!
//! Format (the SDKs' shared file format): `[default]` and `[profile NAME]` sections in the config
//! file, `[NAME]` in the credentials file (where `[profile NAME]` is not a profile); `#` and `;`
//! start comments (on property lines only after whitespace); a property whose value is empty
//! followed by indented `key = value` lines holds sub-properties; an indented line after a
//! property with a value continues it; sections of the same name merge, later keys win.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One section's properties. Sub-properties are stored as `parent.key`.
pub(crate) type Props = BTreeMap<String, String>;

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct File {
    /// Profiles by name (`default`, or NAME of `[profile NAME]` / credentials `[NAME]`).
    pub profiles: BTreeMap<String, Props>,
    /// `[services NAME]` sections.
    pub services: BTreeMap<String, Props>,
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Config,
    Credentials,
}

fn strip_comment(line: &str, need_whitespace: bool) -> &str {
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if (c == b'#' || c == b';')
            && (!need_whitespace || (i > 0 && b[i - 1].is_ascii_whitespace()))
        {
            return &line[..i];
        }
    }
    line
}

/// Parses one file's text. Malformed lines are errors naming the line (the SDKs refuse them too).
pub(crate) fn parse(text: &str, kind: Kind) -> Result<File, String> {
    let mut out = File::default();
    // Where properties go: None = outside any usable section (skipped).
    let mut cur: Option<(bool, String)> = None; // (is_service, name)
    let mut last_key: Option<String> = None;
    let mut parent_key: Option<String> = None; // a property with an empty value
    for (n, raw) in text.lines().enumerate() {
        let lineno = n + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        let indented = raw.starts_with(' ') || raw.starts_with('\t');
        if trimmed.starts_with('[') {
            let header = strip_comment(trimmed, false).trim();
            let Some(inner) = header.strip_prefix('[').and_then(|h| h.strip_suffix(']')) else {
                return Err(format!("line {lineno}: section header without closing ']'"));
            };
            let inner = inner.trim();
            last_key = None;
            parent_key = None;
            cur = match kind {
                Kind::Config => {
                    if inner == "default" {
                        Some((false, "default".into()))
                    } else if let Some(name) = inner
                        .strip_prefix("profile")
                        .filter(|r| r.starts_with([' ', '\t']))
                    {
                        Some((false, name.trim().to_string()))
                    } else {
                        // sso-session and unknown sections are not profiles.
                        inner
                            .strip_prefix("services")
                            .filter(|r| r.starts_with([' ', '\t']))
                            .map(|name| (true, name.trim().to_string()))
                    }
                }
                Kind::Credentials => Some((false, inner.to_string())),
            };
            if let Some((svc, name)) = &cur {
                let map = if *svc {
                    &mut out.services
                } else {
                    &mut out.profiles
                };
                map.entry(name.clone()).or_default();
            }
            continue;
        }
        let line = strip_comment(trimmed, true).trim_end();
        if indented {
            if let Some(parent) = &parent_key {
                let Some((k, v)) = line.split_once('=') else {
                    return Err(format!(
                        "line {lineno}: expected 'key = value' under '{parent}'"
                    ));
                };
                if let Some((svc, name)) = &cur {
                    let map = if *svc {
                        &mut out.services
                    } else {
                        &mut out.profiles
                    };
                    let key = format!("{parent}.{}", k.trim().to_ascii_lowercase());
                    map.get_mut(name).unwrap().insert(key, v.trim().to_string());
                }
                continue;
            }
            if let Some(k) = &last_key {
                if let Some((svc, name)) = &cur {
                    let map = if *svc {
                        &mut out.services
                    } else {
                        &mut out.profiles
                    };
                    let v = map.get_mut(name).unwrap().get_mut(k).unwrap();
                    v.push('\n');
                    v.push_str(line.trim());
                }
                continue;
            }
            return Err(format!(
                "line {lineno}: indented line without a property before it"
            ));
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "line {lineno}: expected 'key = value' or a [section]"
            ));
        };
        let k = k.trim().to_ascii_lowercase();
        let v = v.trim();
        if k.is_empty() {
            return Err(format!("line {lineno}: empty property name"));
        }
        if cur.is_none() {
            last_key = None;
            parent_key = None;
            continue; // property of a skipped section
        }
        let (svc, name) = cur.as_ref().unwrap();
        let map = if *svc {
            &mut out.services
        } else {
            &mut out.profiles
        };
        map.get_mut(name).unwrap().insert(k.clone(), v.to_string());
        if v.is_empty() {
            parent_key = Some(k);
            last_key = None;
        } else {
            parent_key = None;
            last_key = Some(k);
        }
    }
    Ok(out)
}

/// What the files and environment resolve to for S3. Secrets are kept out of `Debug`.
#[derive(Default, Clone, PartialEq)]
pub(crate) struct Resolved {
    pub profile: String,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    /// `Some(true)` virtual-hosted, `Some(false)` path-style, `None` unset.
    pub virtual_hosted: Option<bool>,
    /// Static keys from the files (only when the environment has none).
    pub keys: Option<(String, String, Option<String>)>,
    /// Where the keys came from, for messages: "credentials file" / "config file".
    pub keys_from: Option<&'static str>,
    /// A PEM bundle of extra trusted certificate authorities (`AWS_CA_BUNDLE`, `ca_bundle`).
    pub ca_bundle: Option<PathBuf>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("profile", &self.profile)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("virtual_hosted", &self.virtual_hosted)
            .field(
                "keys",
                &self
                    .keys
                    .as_ref()
                    .map(|(id, _, t)| (id, "***", t.as_ref().map(|_| "***"))),
            )
            .field("keys_from", &self.keys_from)
            .finish()
    }
}

fn home_path(env: &dyn Fn(&str) -> Option<String>, var: &str, default: &str) -> Option<PathBuf> {
    if let Some(p) = env(var).filter(|p| !p.is_empty()) {
        return Some(expand_home(env, &p));
    }
    env("HOME").map(|h| Path::new(&h).join(default))
}

fn expand_home(env: &dyn Fn(&str) -> Option<String>, p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), env("HOME")) {
        (Some(rest), Some(h)) => Path::new(&h).join(rest),
        _ => PathBuf::from(p),
    }
}

fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Resolves profile settings. `env` is the environment (a closure for tests); `read` reads a
/// file (`Ok(None)` when it does not exist).
pub(crate) fn resolve(
    env: &dyn Fn(&str) -> Option<String>,
    read: &dyn Fn(&Path) -> std::io::Result<Option<String>>,
) -> Result<Resolved, String> {
    let explicit = env("AWS_PROFILE")
        .or_else(|| env("AWS_DEFAULT_PROFILE"))
        .filter(|p| !p.is_empty());
    let profile = explicit.clone().unwrap_or_else(|| "default".to_string());
    let load = |var: &str, default: &str, kind: Kind| -> Result<(File, Option<PathBuf>), String> {
        let Some(path) = home_path(env, var, default) else {
            return Ok((File::default(), None));
        };
        match read(&path) {
            Ok(Some(text)) => parse(&text, kind)
                .map(|f| (f, Some(path.clone())))
                .map_err(|e| format!("{}: {e}", path.display())),
            Ok(None) => Ok((File::default(), None)),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    };
    let (config, config_path) = load("AWS_CONFIG_FILE", ".aws/config", Kind::Config)?;
    let (creds, _) = load(
        "AWS_SHARED_CREDENTIALS_FILE",
        ".aws/credentials",
        Kind::Credentials,
    )?;
    let cp = config.profiles.get(&profile);
    let kp = creds.profiles.get(&profile);
    if explicit.is_some() && cp.is_none() && kp.is_none() {
        return Err(format!(
            "the AWS profile '{profile}' (AWS_PROFILE) is in neither the config nor the credentials file"
        ));
    }
    let empty = Props::new();
    let cp = cp.unwrap_or(&empty);
    let kp = kp.unwrap_or(&empty);
    let mut r = Resolved {
        profile: profile.clone(),
        ..Default::default()
    };

    r.region = env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .filter(|v| !v.is_empty())
        .or_else(|| cp.get("region").cloned());

    let ignore = truthy(env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"))
        || cp
            .get("ignore_configured_endpoint_urls")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !ignore {
        let svc = cp
            .get("services")
            .and_then(|name| config.services.get(name));
        r.endpoint = env("AWS_ENDPOINT_URL_S3")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .filter(|v| !v.is_empty())
            .or_else(|| svc.and_then(|s| s.get("s3.endpoint_url")).cloned())
            .or_else(|| cp.get("endpoint_url").cloned());
    }
    r.ca_bundle = env("AWS_CA_BUNDLE")
        .filter(|v| !v.is_empty())
        .or_else(|| cp.get("ca_bundle").cloned())
        .map(PathBuf::from);
    r.virtual_hosted = match cp.get("s3.addressing_style").map(|s| s.as_str()) {
        Some("virtual") => Some(true),
        Some("path") => Some(false),
        _ => None,
    };

    let env_keys = env("AWS_ACCESS_KEY_ID").is_some() || env("AWS_SECRET_ACCESS_KEY").is_some();
    let env_web_identity =
        env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && env("AWS_ROLE_ARN").is_some();
    if !env_keys && !env_web_identity {
        // Credentials file first, then config file (as the CLI).
        for (props, from) in [(kp, "credentials file"), (cp, "config file")] {
            let id = props.get("aws_access_key_id");
            let secret = props.get("aws_secret_access_key");
            match (id, secret) {
                (Some(id), Some(secret)) => {
                    let token = props.get("aws_session_token").cloned();
                    r.keys = Some((id.clone(), secret.clone(), token));
                    r.keys_from = Some(from);
                    break;
                }
                (Some(_), None) | (None, Some(_)) => {
                    return Err(format!(
                        "the AWS profile '{profile}' in the {from} has only one of \
                         aws_access_key_id and aws_secret_access_key"
                    ));
                }
                (None, None) => {}
            }
        }
        if r.keys.is_none() {
            for key in [
                "role_arn",
                "credential_process",
                "sso_session",
                "sso_start_url",
                "web_identity_token_file",
            ] {
                if cp.contains_key(key) || kp.contains_key(key) {
                    let where_ = config_path
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    return Err(format!(
                        "the AWS profile '{profile}' ({where_}) gets its credentials through '{key}', \
                         which shufflefs does not run: export them first, e.g. \
                         eval \"$(aws configure export-credentials --profile {profile} --format env)\""
                    ));
                }
            }
        }
    }
    Ok(r)
}

/// `resolve` over the process environment and the real files.
pub(crate) fn resolve_from_process() -> Result<Resolved, String> {
    resolve(
        &|k| std::env::var(k).ok(),
        &|p| match std::fs::read_to_string(p) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const CONFIG: &str = "\
# comment
[default]
region = eu-west-1 ; trailing comment
output=json

[profile minio]
region = us-east-1
endpoint_url = http://127.0.0.1:9000
s3 =
  addressing_style = path
aws_access_key_id = CFGKEY
aws_secret_access_key = CFGSECRET

[profile svc]
services = local
[services local]
s3 =
  endpoint_url = http://127.0.0.1:5000

[profile role]
role_arn = arn:aws:iam::1:role/x
source_profile = default

[sso-session corp]
sso_region = us-east-1

[minio]
region = ignored-not-a-profile-in-config
";
    const CREDS: &str = "\
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = s3cr3t#not-a-comment
aws_session_token = tok

[minio]
aws_access_key_id = CREDKEY
aws_secret_access_key = CREDSECRET

[profile minio]
aws_access_key_id = WRONG
";

    fn run(vars: &[(&str, &str)]) -> Result<Resolved, String> {
        let mut env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.entry("HOME".into()).or_insert("/home/u".into());
        resolve(&|k| env.get(k).cloned(), &|p| {
            Ok(match p.to_str().unwrap() {
                "/home/u/.aws/config" => Some(CONFIG.to_string()),
                "/home/u/.aws/credentials" => Some(CREDS.to_string()),
                _ => None,
            })
        })
    }

    #[test]
    fn default_profile_from_both_files() {
        let r = run(&[]).unwrap();
        assert_eq!(r.region.as_deref(), Some("eu-west-1"));
        assert_eq!(
            r.keys,
            Some((
                "AKIADEFAULT".into(),
                "s3cr3t#not-a-comment".into(),
                Some("tok".into())
            ))
        );
        assert_eq!(r.keys_from, Some("credentials file"));
        assert_eq!(r.endpoint, None);
    }

    #[test]
    fn named_profile_credentials_file_wins_over_config() {
        let r = run(&[("AWS_PROFILE", "minio")]).unwrap();
        assert_eq!(r.region.as_deref(), Some("us-east-1"));
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(r.virtual_hosted, Some(false));
        assert_eq!(r.keys.as_ref().unwrap().0, "CREDKEY");
    }

    #[test]
    fn env_wins() {
        let r = run(&[
            ("AWS_PROFILE", "minio"),
            ("AWS_REGION", "ap-south-1"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
            ("AWS_ACCESS_KEY_ID", "ENV"),
            ("AWS_SECRET_ACCESS_KEY", "ENVS"),
        ])
        .unwrap();
        assert_eq!(r.region.as_deref(), Some("ap-south-1"));
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(r.keys, None, "env keys are object_store's job");
        let r = run(&[
            ("AWS_PROFILE", "minio"),
            ("AWS_ENDPOINT_URL_S3", "http://s3"),
            ("AWS_ENDPOINT_URL", "http://g"),
        ])
        .unwrap();
        assert_eq!(r.endpoint.as_deref(), Some("http://s3"));
        let r = run(&[
            ("AWS_PROFILE", "minio"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"),
        ])
        .unwrap();
        assert_eq!(r.endpoint, None);
    }

    #[test]
    fn services_section() {
        let r = run(&[("AWS_PROFILE", "svc")]).unwrap();
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
    }

    #[test]
    fn refusals() {
        let e = run(&[("AWS_PROFILE", "nope")]).unwrap_err();
        assert!(e.contains("'nope'"), "{e}");
        let e = run(&[("AWS_PROFILE", "role")]).unwrap_err();
        assert!(
            e.contains("role_arn") && e.contains("export-credentials"),
            "{e}"
        );
        // A role profile with env keys is fine: env keys win.
        assert!(
            run(&[
                ("AWS_PROFILE", "role"),
                ("AWS_ACCESS_KEY_ID", "a"),
                ("AWS_SECRET_ACCESS_KEY", "b")
            ])
            .is_ok()
        );
        assert!(parse("[x\n", Kind::Config).is_err());
        assert!(parse("[default]\njunk\n", Kind::Config).is_err());
    }

    #[test]
    fn debug_redacts() {
        let r = run(&[]).unwrap();
        let s = format!("{r:?}");
        assert!(!s.contains("s3cr3t") && !s.contains("tok\""), "{s}");
        assert!(s.contains("AKIADEFAULT"));
    }
}
