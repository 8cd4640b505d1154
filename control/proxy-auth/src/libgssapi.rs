//! The GSS-API acceptor calls that `auth.negotiate` needs, loaded from MIT Kerberos'
//! `libgssapi_krb5.so.2` at run time: import the service principal, acquire its accepting
//! credential (SPNEGO and Kerberos) from the keytab, accept one client token and name the
//! client. Loading at run time keeps the build free of GSS-API headers, libclang and a
//! link-time libgssapi (issue 30); a host without the library runs everything else, and a
//! configuration that enables `auth.negotiate` fails validation with [`GssUnavailable`]'s
//! reason.
//!
//! This module is the unsafe boundary of SPNEGO: the declarations below are RFC 2744's C
//! bindings as MIT's `<gssapi/gssapi.h>` gives them (no structure packing on Linux); what it
//! exports is safe to call.
#![allow(unsafe_code)]

use libloading::Library;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// The soname this module loads, and the Debian package that ships it.
pub const SONAME: &str = "libgssapi_krb5.so.2";
pub const PACKAGE: &str = "libgssapi-krb5-2";

type OmUint32 = u32;
type Handle = *mut c_void;

#[repr(C)]
struct OidDesc {
    length: OmUint32,
    elements: *const c_void,
}

#[repr(C)]
struct OidSetDesc {
    count: usize,
    elements: *const OidDesc,
}

#[repr(C)]
struct BufferDesc {
    length: usize,
    value: *mut c_void,
}

impl BufferDesc {
    fn empty() -> Self {
        Self {
            length: 0,
            value: std::ptr::null_mut(),
        }
    }
}

// DER contents of the OIDs used (RFC 2743 / RFC 4178 / RFC 1964).
/// 1.2.840.113554.1.2.2.1, GSS_KRB5_NT_PRINCIPAL_NAME
const KRB5_PRINCIPAL_NAME: &[u8] = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x02\x01";
/// 1.2.840.113554.1.2.2, the Kerberos 5 mechanism
const MECH_KRB5: &[u8] = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x02";
/// 1.3.6.1.5.5.2, SPNEGO
const MECH_SPNEGO: &[u8] = b"\x2b\x06\x01\x05\x05\x02";

const GSS_C_ACCEPT: c_int = 2;
const GSS_C_INDEFINITE: OmUint32 = 0xffff_ffff;
const GSS_C_GSS_CODE: c_int = 1;
const GSS_C_MECH_CODE: c_int = 2;
const GSS_S_COMPLETE: OmUint32 = 0;
const GSS_S_CONTINUE_NEEDED: OmUint32 = 1;
/// Calling and routine error bits (`GSS_ERROR()`); the low 16 bits are supplementary info.
const GSS_ERROR_BITS: OmUint32 = 0xffff_0000;

type ImportNameFn = unsafe extern "C" fn(
    minor: *mut OmUint32,
    input_name_buffer: *const BufferDesc,
    input_name_type: *const OidDesc,
    output_name: *mut Handle,
) -> OmUint32;
type AcquireCredFn = unsafe extern "C" fn(
    minor: *mut OmUint32,
    desired_name: Handle,
    time_req: OmUint32,
    desired_mechs: *const OidSetDesc,
    cred_usage: c_int,
    output_cred_handle: *mut Handle,
    actual_mechs: *mut *mut OidSetDesc,
    time_rec: *mut OmUint32,
) -> OmUint32;
type AcceptSecContextFn = unsafe extern "C" fn(
    minor: *mut OmUint32,
    context_handle: *mut Handle,
    acceptor_cred_handle: Handle,
    input_token_buffer: *const BufferDesc,
    input_chan_bindings: *const c_void,
    src_name: *mut Handle,
    mech_type: *mut *const OidDesc,
    output_token: *mut BufferDesc,
    ret_flags: *mut OmUint32,
    time_rec: *mut OmUint32,
    delegated_cred_handle: *mut Handle,
) -> OmUint32;
type DisplayNameFn = unsafe extern "C" fn(
    minor: *mut OmUint32,
    input_name: Handle,
    output_name_buffer: *mut BufferDesc,
    output_name_type: *mut *const OidDesc,
) -> OmUint32;
type DisplayStatusFn = unsafe extern "C" fn(
    minor: *mut OmUint32,
    status_value: OmUint32,
    status_type: c_int,
    mech_type: *const OidDesc,
    message_context: *mut OmUint32,
    status_string: *mut BufferDesc,
) -> OmUint32;
type ReleaseHandleFn = unsafe extern "C" fn(minor: *mut OmUint32, handle: *mut Handle) -> OmUint32;
type ReleaseBufferFn =
    unsafe extern "C" fn(minor: *mut OmUint32, buffer: *mut BufferDesc) -> OmUint32;
type DeleteSecContextFn = unsafe extern "C" fn(
    minor: *mut OmUint32,
    context_handle: *mut Handle,
    output_token: *mut BufferDesc,
) -> OmUint32;

/// `libgssapi_krb5.so.2` could not be loaded or lacks a symbol: SPNEGO is unavailable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{SONAME} could not be loaded ({cause}); install the {PACKAGE} package for auth.negotiate")]
pub struct GssUnavailable {
    pub cause: String,
}

/// A failed GSS-API call: which call, and the library's text for its major and minor codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GssError {
    #[error(transparent)]
    Unavailable(#[from] GssUnavailable),
    #[error("{call}: {message}")]
    Call { call: &'static str, message: String },
}

struct Api {
    import_name: ImportNameFn,
    acquire_cred: AcquireCredFn,
    accept_sec_context: AcceptSecContextFn,
    display_name: DisplayNameFn,
    display_status: DisplayStatusFn,
    release_name: ReleaseHandleFn,
    release_cred: ReleaseHandleFn,
    release_buffer: ReleaseBufferFn,
    delete_sec_context: DeleteSecContextFn,
    // Never dropped (the value lives in a static): the pointers above point into it.
    _library: Library,
}

static API: OnceLock<Result<Api, GssUnavailable>> = OnceLock::new();

fn api() -> Result<&'static Api, GssUnavailable> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, GssUnavailable> {
    let unavailable = |e: libloading::Error| GssUnavailable {
        cause: e.to_string(),
    };
    // SAFETY: the Kerberos libraries' initialisers only set up their own state.
    let library = unsafe { Library::new(SONAME) }.map_err(unavailable)?;
    // SAFETY: each symbol gets the signature RFC 2744 / MIT's gssapi.h declare (type aliases
    // above); the pointers stay valid as long as `library`, which `Api` keeps.
    unsafe {
        Ok(Api {
            import_name: *library.get(b"gss_import_name\0").map_err(unavailable)?,
            acquire_cred: *library.get(b"gss_acquire_cred\0").map_err(unavailable)?,
            accept_sec_context: *library
                .get(b"gss_accept_sec_context\0")
                .map_err(unavailable)?,
            display_name: *library.get(b"gss_display_name\0").map_err(unavailable)?,
            display_status: *library.get(b"gss_display_status\0").map_err(unavailable)?,
            release_name: *library.get(b"gss_release_name\0").map_err(unavailable)?,
            release_cred: *library.get(b"gss_release_cred\0").map_err(unavailable)?,
            release_buffer: *library.get(b"gss_release_buffer\0").map_err(unavailable)?,
            delete_sec_context: *library
                .get(b"gss_delete_sec_context\0")
                .map_err(unavailable)?,
            _library: library,
        })
    }
}

/// Whether GSS-API can be used on this host (loads the library on first use).
pub fn available() -> Result<(), GssUnavailable> {
    api().map(|_| ())
}

fn oid(der: &'static [u8]) -> OidDesc {
    OidDesc {
        // the OIDs above are a few bytes long
        length: der.len() as OmUint32,
        elements: der.as_ptr().cast(),
    }
}

impl Api {
    /// `call` failed with `major`/`minor`: the library's texts for both.
    fn error(&self, call: &'static str, major: OmUint32, minor: OmUint32) -> GssError {
        let mut parts = self.status_texts(major, GSS_C_GSS_CODE);
        if minor != 0 {
            parts.extend(self.status_texts(minor, GSS_C_MECH_CODE));
        }
        GssError::Call {
            call,
            message: parts.join(": "),
        }
    }

    /// Every message gss_display_status has for `code` (it may hold several).
    fn status_texts(&self, code: OmUint32, kind: c_int) -> Vec<String> {
        let mut texts = Vec::new();
        let mut context: OmUint32 = 0;
        // bounded: a library that never clears the context must not loop forever
        for _ in 0..8 {
            let mut minor = 0;
            let mut text = BufferDesc::empty();
            // SAFETY: out-pointers to locals; the buffer is released below.
            let major = unsafe {
                (self.display_status)(
                    &mut minor,
                    code,
                    kind,
                    std::ptr::null(),
                    &mut context,
                    &mut text,
                )
            };
            if major & GSS_ERROR_BITS != 0 {
                break;
            }
            texts.push(self.take_string(&mut text));
            if context == 0 {
                break;
            }
        }
        if texts.is_empty() {
            texts.push(format!("GSS-API status {code:#x}"));
        }
        texts
    }

    /// The buffer's bytes as text; releases the buffer.
    fn take_string(&self, buffer: &mut BufferDesc) -> String {
        let text = if buffer.value.is_null() || buffer.length == 0 {
            String::new()
        } else {
            // SAFETY: the library filled `length` bytes at `value`.
            let bytes =
                unsafe { std::slice::from_raw_parts(buffer.value as *const u8, buffer.length) };
            String::from_utf8_lossy(bytes)
                .trim_end_matches('\0')
                .to_owned()
        };
        let mut minor = 0;
        // SAFETY: a buffer the library allocated (or an empty one, which it ignores).
        unsafe { (self.release_buffer)(&mut minor, buffer) };
        text
    }
}

/// An accepting credential for one service principal (from the keytab that `KRB5_KTNAME`
/// names), for SPNEGO and Kerberos.
#[derive(Debug)]
pub struct AcceptorCredential {
    handle: Handle,
}

// SAFETY: the handle is only passed to gss_accept_sec_context and gss_release_cred; MIT's
// credential record carries its own mutex, so concurrent accepts with one credential (from
// tokio's blocking pool) are safe, and it may be released from any thread.
unsafe impl Send for AcceptorCredential {}
// SAFETY: as above.
unsafe impl Sync for AcceptorCredential {}

impl Drop for AcceptorCredential {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            let mut minor = 0;
            // SAFETY: a credential gss_acquire_cred returned, released once.
            unsafe { (api.release_cred)(&mut minor, &mut self.handle) };
        }
    }
}

impl AcceptorCredential {
    /// Imports `principal` (`service/host@REALM`) and acquires its accepting credential.
    pub fn acquire(principal: &str) -> Result<Self, GssError> {
        let api = api()?;
        let name_type = oid(KRB5_PRINCIPAL_NAME);
        let input = BufferDesc {
            length: principal.len(),
            value: principal.as_ptr() as *mut c_void,
        };
        let mut minor = 0;
        let mut name: Handle = std::ptr::null_mut();
        // SAFETY: the input buffer and OID point at live data the call only reads.
        let major = unsafe { (api.import_name)(&mut minor, &input, &name_type, &mut name) };
        if major & GSS_ERROR_BITS != 0 {
            return Err(api.error("gss_import_name", major, minor));
        }
        let mechs = [oid(MECH_SPNEGO), oid(MECH_KRB5)];
        let mech_set = OidSetDesc {
            count: mechs.len(),
            elements: mechs.as_ptr(),
        };
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `name` is the imported name; the mechanism set lives across the call; the
        // optional outputs are null.
        let major = unsafe {
            (api.acquire_cred)(
                &mut minor,
                name,
                GSS_C_INDEFINITE,
                &mech_set,
                GSS_C_ACCEPT,
                &mut handle,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        let acquired = if major & GSS_ERROR_BITS != 0 {
            Err(api.error("gss_acquire_cred", major, minor))
        } else {
            Ok(Self { handle })
        };
        let mut release_minor = 0;
        // SAFETY: releases the imported name once.
        unsafe { (api.release_name)(&mut release_minor, &mut name) };
        acquired
    }

    /// Accepts one client token. `Ok(Some(principal))` when it completes a context (the
    /// client's `user@REALM`), `Ok(None)` when the mechanism wants another round trip (not
    /// offered: Kerberos completes in one), `Err` when the token is refused.
    pub fn accept(&self, token: &[u8]) -> Result<Option<String>, GssError> {
        let api = api()?;
        let input = BufferDesc {
            length: token.len(),
            value: token.as_ptr() as *mut c_void,
        };
        let mut minor = 0;
        let mut context: Handle = std::ptr::null_mut();
        let mut source: Handle = std::ptr::null_mut();
        let mut output = BufferDesc::empty();
        // SAFETY: a fresh context, the live credential and input token, out-pointers to
        // locals; the outputs are released below.
        let major = unsafe {
            (api.accept_sec_context)(
                &mut minor,
                &mut context,
                self.handle,
                &input,
                std::ptr::null(),
                &mut source,
                std::ptr::null_mut(),
                &mut output,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        let outcome = if major & GSS_ERROR_BITS != 0 {
            Err(api.error("gss_accept_sec_context", major, minor))
        } else if major & GSS_S_CONTINUE_NEEDED != 0 || major & 0xffff != GSS_S_COMPLETE {
            // more legs wanted, or a supplementary warning (duplicate/old/unseq token)
            Ok(None)
        } else {
            display_name(api, source).map(Some)
        };
        // SAFETY: each output is released once (null handles and empty buffers are ignored).
        unsafe {
            let mut release_minor = 0;
            (api.release_buffer)(&mut release_minor, &mut output);
            if !source.is_null() {
                (api.release_name)(&mut release_minor, &mut source);
            }
            if !context.is_null() {
                (api.delete_sec_context)(&mut release_minor, &mut context, std::ptr::null_mut());
            }
        }
        outcome
    }
}

fn display_name(api: &Api, name: Handle) -> Result<String, GssError> {
    let mut minor = 0;
    let mut text = BufferDesc::empty();
    // SAFETY: `name` is the source name accept returned; the buffer is released by
    // take_string.
    let major = unsafe { (api.display_name)(&mut minor, name, &mut text, std::ptr::null_mut()) };
    if major & GSS_ERROR_BITS != 0 {
        return Err(api.error("gss_display_name", major, minor));
    }
    Ok(api.take_string(&mut text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the real library (the suite's machines have it: libgssapi-krb5-2 comes with
    /// curl and ssh): a principal with no keytab entry is refused with the library's words.
    #[test]
    fn the_library_loads_and_explains_refusals() {
        if available().is_err() {
            eprintln!("SKIP: {SONAME} not on this machine");
            return;
        }
        // no KRB5_KTNAME change here (tests run threaded): the default keytab is missing on
        // test machines or lacks this principal
        let err = AcceptorCredential::acquire("HTTP/no-such-host.invalid@NO.SUCH.REALM")
            .expect_err("no keys for this principal");
        assert!(err.to_string().starts_with("gss_acquire_cred: "), "{err}");
    }

    #[test]
    fn oids_are_the_registered_ones() {
        // 1.2.840.113554.1.2.2 → 2a 86 48 86 f7 12 01 02 02 (X.690 base-128 arcs)
        assert_eq!(&KRB5_PRINCIPAL_NAME[..MECH_KRB5.len()], MECH_KRB5);
        assert_eq!(KRB5_PRINCIPAL_NAME.last(), Some(&1));
        assert_eq!(MECH_SPNEGO.len(), 6);
    }
}
