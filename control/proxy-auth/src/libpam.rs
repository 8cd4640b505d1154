//! The five calls of the PAM application API that `auth.mode: system` needs (`pam_start`,
//! `pam_authenticate`, `pam_acct_mgmt`, `pam_end`, `pam_strerror`), loaded from `libpam.so.0`
//! at run time. Loading at run time keeps the build free of libpam's headers, libclang and a
//! link-time libpam (issue 30): the binary builds with only the Rust toolchain and a C compiler,
//! and a host without libpam still runs everything but this mode, which then reports
//! `build_disabled` with [`PamUnavailable`]'s reason.
//!
//! This module is the unsafe boundary of the PAM mode: the C declarations below are those of
//! Linux-PAM's `<security/_pam_types.h>` and `<security/pam_appl.h>` (ABI stable since
//! Linux-PAM 0.99, soname `libpam.so.0`); everything it exports is safe to call.
#![allow(unsafe_code)]

use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The soname this module loads, and the Debian package that ships it.
pub const SONAME: &str = "libpam.so.0";
pub const PACKAGE: &str = "libpam0g";

// Return codes (`_pam_types.h`) this crate tells apart.
pub const PAM_SUCCESS: c_int = 0;
pub const PAM_PERM_DENIED: c_int = 6;
pub const PAM_AUTH_ERR: c_int = 7;
pub const PAM_CRED_INSUFFICIENT: c_int = 8;
#[cfg(test)]
pub const PAM_AUTHINFO_UNAVAIL: c_int = 9;
pub const PAM_USER_UNKNOWN: c_int = 10;
pub const PAM_MAXTRIES: c_int = 11;
pub const PAM_NEW_AUTHTOK_REQD: c_int = 12;
pub const PAM_ACCT_EXPIRED: c_int = 13;
pub const PAM_CONV_ERR: c_int = 19;
pub const PAM_AUTHTOK_ERR: c_int = 20;
pub const PAM_SYSTEM_ERR: c_int = 4;
const PAM_BUF_ERR: c_int = 5;

// Flags.
pub const PAM_SILENT: c_int = 0x8000;
pub const PAM_DISALLOW_NULL_AUTHTOK: c_int = 0x0001;

// Conversation message styles.
const PAM_PROMPT_ECHO_OFF: c_int = 1;
const PAM_PROMPT_ECHO_ON: c_int = 2;

#[repr(C)]
struct PamMessage {
    msg_style: c_int,
    msg: *const c_char,
}

#[repr(C)]
struct PamResponse {
    resp: *mut c_char,
    resp_retcode: c_int,
}

type ConvFn = unsafe extern "C" fn(
    num_msg: c_int,
    msg: *mut *const PamMessage,
    resp: *mut *mut PamResponse,
    appdata_ptr: *mut c_void,
) -> c_int;

#[repr(C)]
struct PamConv {
    conv: Option<ConvFn>,
    appdata_ptr: *mut c_void,
}

/// An opaque `pam_handle_t`.
#[repr(C)]
struct PamHandle {
    _private: [u8; 0],
}

type StartFn = unsafe extern "C" fn(
    service_name: *const c_char,
    user: *const c_char,
    pam_conversation: *const PamConv,
    pamh: *mut *mut PamHandle,
) -> c_int;
type FlagsFn = unsafe extern "C" fn(pamh: *mut PamHandle, flags: c_int) -> c_int;
type EndFn = unsafe extern "C" fn(pamh: *mut PamHandle, pam_status: c_int) -> c_int;
type StrerrorFn = unsafe extern "C" fn(pamh: *mut PamHandle, errnum: c_int) -> *const c_char;

/// `libpam.so.0` could not be loaded or lacks a symbol: the `system` mode is unavailable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{SONAME} could not be loaded ({cause}); install the {PACKAGE} package for auth.mode system"
)]
pub struct PamUnavailable {
    pub cause: String,
}

/// The loaded library and the functions taken from it.
struct Api {
    start: StartFn,
    authenticate: FlagsFn,
    acct_mgmt: FlagsFn,
    end: EndFn,
    strerror: StrerrorFn,
    // Kept last and never dropped (the value lives in a static): the function pointers above
    // point into it.
    _library: Library,
}

static API: OnceLock<Result<Api, PamUnavailable>> = OnceLock::new();

fn api() -> Result<&'static Api, PamUnavailable> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, PamUnavailable> {
    let unavailable = |e: libloading::Error| PamUnavailable {
        cause: e.to_string(),
    };
    // SAFETY: libpam's initialisers only set up its own state; loading it has no other effect
    // on this process.
    let library = unsafe { Library::new(SONAME) }.map_err(unavailable)?;
    // SAFETY: each symbol is declared with the signature Linux-PAM's headers give it (see the
    // type aliases above); the pointers stay valid as long as `library`, which `Api` keeps.
    unsafe {
        Ok(Api {
            start: *library
                .get::<StartFn>(b"pam_start\0")
                .map_err(unavailable)?,
            authenticate: *library
                .get::<FlagsFn>(b"pam_authenticate\0")
                .map_err(unavailable)?,
            acct_mgmt: *library
                .get::<FlagsFn>(b"pam_acct_mgmt\0")
                .map_err(unavailable)?,
            end: *library.get::<EndFn>(b"pam_end\0").map_err(unavailable)?,
            strerror: *library
                .get::<StrerrorFn>(b"pam_strerror\0")
                .map_err(unavailable)?,
            _library: library,
        })
    }
}

/// Whether PAM can be used on this host (loads the library on first use).
pub fn available() -> Result<(), PamUnavailable> {
    api().map(|_| ())
}

/// What a PAM call answered: its return code and PAM's own text for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PamError {
    pub code: c_int,
    pub message: String,
}

impl std::fmt::Display for PamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (PAM code {})", self.message, self.code)
    }
}

/// Why a transaction could not run or did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransactionError {
    #[error(transparent)]
    Unavailable(#[from] PamUnavailable),
    #[error("pam_start failed: {0}")]
    Start(PamError),
    #[error("{0}")]
    Step(PamError),
}

/// The answers the conversation gives: the user name to echoed prompts, the password to
/// hidden ones. Lives on the caller's stack for the whole transaction.
struct Credentials {
    user: CString,
    password: CString,
}

/// The conversation callback: answers every prompt of a PAM module non-interactively.
///
/// # Safety
/// Called by libpam with `num_msg` messages in `msg` (Linux-PAM passes an array of pointers),
/// `resp` to fill and `appdata_ptr` = the `Credentials` that [`authenticate`] registered.
unsafe extern "C" fn converse(
    num_msg: c_int,
    msg: *mut *const PamMessage,
    resp: *mut *mut PamResponse,
    appdata_ptr: *mut c_void,
) -> c_int {
    let Ok(count) = usize::try_from(num_msg) else {
        return PAM_CONV_ERR;
    };
    if count == 0 || msg.is_null() || resp.is_null() || appdata_ptr.is_null() {
        return PAM_CONV_ERR;
    }
    // SAFETY: `appdata_ptr` is the `&Credentials` registered with pam_start, alive for the
    // whole transaction.
    let credentials = unsafe { &*(appdata_ptr as *const Credentials) };
    // PAM frees the array and each answer with free(3), so both come from the C allocator.
    // SAFETY: calloc with a non-zero count; checked for null below.
    let answers =
        unsafe { libc::calloc(count, std::mem::size_of::<PamResponse>()) } as *mut PamResponse;
    if answers.is_null() {
        return PAM_BUF_ERR;
    }
    for i in 0..count {
        // SAFETY: libpam passes `count` valid message pointers.
        let message = unsafe { *msg.add(i) };
        if message.is_null() {
            continue;
        }
        // SAFETY: a non-null message pointer from libpam points at a pam_message.
        let style = unsafe { (*message).msg_style };
        let answer = match style {
            PAM_PROMPT_ECHO_ON => Some(&credentials.user),
            PAM_PROMPT_ECHO_OFF => Some(&credentials.password),
            // error and info texts need no answer
            _ => None,
        };
        if let Some(text) = answer {
            // SAFETY: `text` is a NUL-terminated C string; strdup copies it with malloc.
            let copy = unsafe { libc::strdup(text.as_ptr()) };
            if copy.is_null() {
                // SAFETY: free what this call allocated so far, then fail the conversation.
                unsafe { free_answers(answers, i) };
                return PAM_BUF_ERR;
            }
            // SAFETY: `i < count`, within the calloc'd array.
            unsafe { (*answers.add(i)).resp = copy };
        }
    }
    // SAFETY: `resp` is non-null; libpam takes ownership of the array.
    unsafe { *resp = answers };
    PAM_SUCCESS
}

/// Frees the first `filled` answers and the array (a conversation that failed half-way).
///
/// # Safety
/// `answers` is a calloc'd array of at least `filled` responses whose `resp` are null or
/// malloc'd.
unsafe fn free_answers(answers: *mut PamResponse, filled: usize) {
    for i in 0..filled {
        // SAFETY: per the contract above.
        unsafe {
            let answer = (*answers.add(i)).resp;
            if !answer.is_null() {
                // The password must not linger in freed memory.
                libc::memset(answer.cast(), 0, libc::strlen(answer));
                libc::free(answer.cast());
            }
        }
    }
    // SAFETY: the array itself came from calloc.
    unsafe { libc::free(answers.cast()) };
}

/// One PAM transaction: `pam_start(service, user)`, `pam_authenticate(flags)`, then
/// `pam_acct_mgmt(flags)`, and `pam_end` in every case. `Ok(())` only when both steps
/// succeeded; otherwise the first failing step's code and PAM's text for it. User, password
/// and service must not contain NUL bytes (the caller refuses those).
pub fn authenticate(
    service: &str,
    user: &str,
    password: &str,
    flags: c_int,
) -> Result<(), TransactionError> {
    let api = api()?;
    let nul = |what: &str| {
        TransactionError::Start(PamError {
            code: PAM_SYSTEM_ERR,
            message: format!("{what} contains a NUL byte"),
        })
    };
    let service_c = CString::new(service).map_err(|_| nul("the service name"))?;
    let credentials = Credentials {
        user: CString::new(user).map_err(|_| nul("the user name"))?,
        password: CString::new(password).map_err(|_| nul("the password"))?,
    };
    let conversation = PamConv {
        conv: Some(converse),
        appdata_ptr: &credentials as *const Credentials as *mut c_void,
    };
    let mut handle: *mut PamHandle = std::ptr::null_mut();
    // SAFETY: valid C strings and a conversation that outlive the transaction (pam_end below
    // runs before they go out of scope); `handle` receives the new transaction.
    let started = unsafe {
        (api.start)(
            service_c.as_ptr(),
            credentials.user.as_ptr(),
            &conversation,
            &mut handle,
        )
    };
    if started != PAM_SUCCESS || handle.is_null() {
        return Err(TransactionError::Start(error(api, handle, started)));
    }
    // SAFETY: `handle` is the live transaction pam_start returned.
    let mut status = unsafe { (api.authenticate)(handle, flags) };
    if status == PAM_SUCCESS {
        // SAFETY: as above.
        status = unsafe { (api.acct_mgmt)(handle, flags) };
    }
    let outcome = if status == PAM_SUCCESS {
        Ok(())
    } else {
        Err(TransactionError::Step(error(api, handle, status)))
    };
    // SAFETY: ends the transaction exactly once; `handle` is not used afterwards.
    unsafe { (api.end)(handle, status) };
    outcome
}

/// `code` with PAM's text for it.
fn error(api: &Api, handle: *mut PamHandle, code: c_int) -> PamError {
    // SAFETY: pam_strerror accepts any handle (it ignores it in Linux-PAM) and returns a
    // static string or null.
    let text = unsafe { (api.strerror)(handle, code) };
    let message = if text.is_null() {
        format!("PAM error {code}")
    } else {
        // SAFETY: a non-null result is a NUL-terminated static string.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    PamError { code, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversation answers hidden prompts with the password and echoed ones with the
    /// user name, with memory PAM can free(3).
    #[test]
    fn the_conversation_answers_each_prompt() {
        let credentials = Credentials {
            user: CString::new("alice").expect("no NUL"),
            password: CString::new("s3cret").expect("no NUL"),
        };
        let prompt = CString::new("Password: ").expect("no NUL");
        let messages = [
            PamMessage {
                msg_style: PAM_PROMPT_ECHO_OFF,
                msg: prompt.as_ptr(),
            },
            PamMessage {
                msg_style: PAM_PROMPT_ECHO_ON,
                msg: prompt.as_ptr(),
            },
            PamMessage {
                msg_style: 4, // PAM_TEXT_INFO
                msg: prompt.as_ptr(),
            },
        ];
        let mut pointers: Vec<*const PamMessage> = messages.iter().map(|m| m as *const _).collect();
        let mut answers: *mut PamResponse = std::ptr::null_mut();
        // SAFETY: three valid messages, an out-pointer and the credentials, as libpam calls it.
        let code = unsafe {
            converse(
                3,
                pointers.as_mut_ptr(),
                &mut answers,
                &credentials as *const Credentials as *mut c_void,
            )
        };
        assert_eq!(code, PAM_SUCCESS);
        // SAFETY: the conversation filled three calloc'd answers.
        unsafe {
            let text = |i: usize| {
                let p = (*answers.add(i)).resp;
                (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
            };
            assert_eq!(text(0).as_deref(), Some("s3cret"));
            assert_eq!(text(1).as_deref(), Some("alice"));
            assert_eq!(text(2), None);
            free_answers(answers, 3);
        }
    }

    #[test]
    fn a_conversation_without_messages_is_an_error() {
        let mut answers: *mut PamResponse = std::ptr::null_mut();
        // SAFETY: a null message array is refused before anything is read.
        let code = unsafe { converse(0, std::ptr::null_mut(), &mut answers, std::ptr::null_mut()) };
        assert_eq!(code, PAM_CONV_ERR);
        assert!(answers.is_null());
    }
}
