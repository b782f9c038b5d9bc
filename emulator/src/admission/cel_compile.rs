//! Compile-time checking of admission CEL, as the API server does when it
//! validates a policy or webhook configuration and when it builds the
//! evaluators.
//!
//! Upstream (k8s.io/apiserver unless named):
//! - `pkg/admission/plugin/cel/compile.go` `CompileCELExpression`: parse, type
//!   check against the declared variables, then require the output type
//!   ("must evaluate to bool"); `createEnvForOpts`/`mustBuildEnvs`: `object`,
//!   `oldObject` (dyn), `request` (`kubernetes.AdmissionRequest`, typed by
//!   `buildRequestType`), `params` (dyn, only with params),
//!   `namespaceObject` (typed), `authorizer` (only with an authorizer), and the
//!   `JSONPatch` / `Object.*` types only with `HasPatchTypes`.
//! - `pkg/admission/plugin/cel/composition.go` `CompositedCompiler`:
//!   `variables` is an object type whose fields are the variables declared
//!   so far, each with its compiled output type.
//! - `pkg/admission/plugin/policy/mutating/compilation.go` `compilePolicy`:
//!   `HasPatchTypes` is set for the mutation evaluators only; variables and
//!   matchConditions are compiled without it.
//! - google/cel-go `checker/checker.go`, `checker/errors.go` and
//!   `common/errors.go` `ToDisplayString`: the error texts ("undeclared
//!   reference to 'x' (in container '')", "undefined field 'x'", "found no
//!   matching overload for 'f' applied to '(a, b)'") and their display, one
//!   `ERROR: <input>:line:col: msg` per issue with the source line and a caret.
//!
//! The checker here covers identifiers, struct types, fields of the typed
//! variables, the core operators' overloads and the output type. Functions of
//! the Kubernetes CEL libraries are known by name and typed loosely (their
//! arguments are not checked): an expression upstream refuses for a library
//! argument type is accepted here (listed as *assumed* in emulator/README.md).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use cel::common::ast::operators as op;
use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr,
    SelectExpr, SourceInfo, StructExpr,
};

/// A CEL type as the checker sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    Dyn,
    /// The element type of an empty list or map literal: unifies with any.
    Free,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Object(Arc<ObjType>),
    /// A type value (`int`, `Object.spec`).
    Type,
    Optional(Box<Ty>),
    /// Already reported: suppresses follow-up errors.
    Error,
}

/// A declared object type. `fields: None` is open (every field `dyn`): the
/// `Object.*` types of the unstructured type provider and the schema-less
/// parts of typed objects.
#[derive(Debug, PartialEq)]
pub struct ObjType {
    pub name: String,
    pub fields: Option<BTreeMap<String, Ty>>,
}

impl Ty {
    pub fn object(name: &str, fields: &[(&str, Ty)]) -> Ty {
        Ty::Object(Arc::new(ObjType {
            name: name.into(),
            fields: Some(
                fields
                    .iter()
                    .map(|(n, t)| (n.to_string(), t.clone()))
                    .collect(),
            ),
        }))
    }

    fn open(name: &str) -> Ty {
        Ty::Object(Arc::new(ObjType {
            name: name.into(),
            fields: None,
        }))
    }

    fn list(t: Ty) -> Ty {
        Ty::List(Box::new(t))
    }

    fn map(k: Ty, v: Ty) -> Ty {
        Ty::Map(Box::new(k), Box::new(v))
    }

    fn is_dyn(&self) -> bool {
        matches!(self, Ty::Dyn | Ty::Free | Ty::Error)
    }

    fn is_numeric(&self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Dyn | Ty::Free => write!(f, "dyn"),
            Ty::Null => write!(f, "null_type"),
            Ty::Bool => write!(f, "bool"),
            Ty::Int => write!(f, "int"),
            Ty::Uint => write!(f, "uint"),
            Ty::Double => write!(f, "double"),
            Ty::String => write!(f, "string"),
            Ty::Bytes => write!(f, "bytes"),
            Ty::Duration => write!(f, "google.protobuf.Duration"),
            Ty::Timestamp => write!(f, "google.protobuf.Timestamp"),
            Ty::List(e) => write!(f, "list({e})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Object(o) => write!(f, "{}", o.name),
            Ty::Type => write!(f, "type"),
            Ty::Optional(t) => write!(f, "optional_type({t})"),
            Ty::Error => write!(f, "*error*"),
        }
    }
}

/// `a` can take a value of `b` (cel-go `isAssignable`, with dyn both ways).
fn assignable(a: &Ty, b: &Ty) -> bool {
    match (a, b) {
        _ if a.is_dyn() || b.is_dyn() => true,
        (Ty::List(x), Ty::List(y)) => assignable(x, y),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => assignable(k1, k2) && assignable(v1, v2),
        (Ty::Optional(x), Ty::Optional(y)) => assignable(x, y),
        (Ty::Object(x), Ty::Object(y)) => x.name == y.name,
        (Ty::Object(_), Ty::Null) => true,
        _ => a == b,
    }
}

/// The common type of two assignable types, the more specific one kept for a
/// free element type (cel-go `joinTypes`/`mostGeneral` with type parameters).
fn join(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::Free | Ty::Error, _) => b.clone(),
        (_, Ty::Free | Ty::Error) => a.clone(),
        (Ty::Dyn, _) | (_, Ty::Dyn) => Ty::Dyn,
        (Ty::List(x), Ty::List(y)) => Ty::list(join(x, y)),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => Ty::map(join(k1, k2), join(v1, v2)),
        (Ty::Optional(x), Ty::Optional(y)) => Ty::Optional(Box::new(join(x, y))),
        (Ty::Object(_), Ty::Null) => a.clone(),
        (Ty::Null, Ty::Object(_)) => b.clone(),
        _ => a.clone(),
    }
}

/// Which variables and types an expression is compiled with
/// (`OptionalVariableDeclarations` plus the composition's variables).
#[derive(Debug, Clone, Default)]
pub struct Decls {
    pub params: bool,
    pub authorizer: bool,
    pub patch_types: bool,
    /// `variables.<name>` declared before this expression, with their types.
    pub variables: Option<Vec<(String, Ty)>>,
}

/// The output an expression kind must have (`ReturnTypes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Any,
    Bool,
    String,
    /// An auditAnnotation: `string` or `null_type`.
    StringOrNull,
    /// A JSONPatch mutation: `list(JSONPatch)`.
    JsonPatches,
    /// An ApplyConfiguration mutation: `Object`.
    ApplyConfiguration,
}

/// `kubernetes.AdmissionRequest` as `buildRequestType` declares it.
pub fn request_type() -> Ty {
    let s = || Ty::String;
    let gvk = Ty::object(
        "kubernetes.GroupVersionKind",
        &[("group", s()), ("version", s()), ("kind", s())],
    );
    let gvr = Ty::object(
        "kubernetes.GroupVersionResource",
        &[("group", s()), ("version", s()), ("resource", s())],
    );
    let user = Ty::object(
        "kubernetes.UserInfo",
        &[
            ("username", s()),
            ("uid", s()),
            ("groups", Ty::list(s())),
            ("extra", Ty::map(s(), Ty::list(s()))),
        ],
    );
    Ty::object(
        "kubernetes.AdmissionRequest",
        &[
            ("kind", gvk.clone()),
            ("resource", gvr.clone()),
            ("subResource", s()),
            ("requestKind", gvk),
            ("requestResource", gvr),
            ("requestSubResource", s()),
            ("name", s()),
            ("namespace", s()),
            ("operation", s()),
            ("userInfo", user),
            ("dryRun", Ty::Bool),
            ("options", Ty::Dyn),
        ],
    )
}

/// `kubernetes.Namespace` as `BuildNamespaceType` declares it.
fn namespace_type() -> Ty {
    let s = || Ty::String;
    let smap = || Ty::map(Ty::String, Ty::String);
    let meta = Ty::object(
        "kubernetes.NamespaceMetadata",
        &[
            ("name", s()),
            ("generateName", s()),
            ("namespace", s()),
            ("labels", smap()),
            ("annotations", smap()),
            ("UID", s()),
            ("creationTimestamp", Ty::Timestamp),
            ("deletionGracePeriodSeconds", Ty::Int),
            ("deletionTimestamp", Ty::Timestamp),
            ("generation", Ty::Int),
            ("resourceVersion", s()),
            ("finalizers", Ty::list(s())),
        ],
    );
    Ty::object(
        "kubernetes.Namespace",
        &[
            ("metadata", meta),
            (
                "spec",
                Ty::object("kubernetes.NamespaceSpec", &[("finalizers", Ty::list(s()))]),
            ),
            (
                "status",
                Ty::object(
                    "kubernetes.NamespaceStatus",
                    &[("conditions", Ty::list(Ty::Dyn)), ("phase", s())],
                ),
            ),
        ],
    )
}

/// The `JSONPatch` type of the mutation environment (`patch/json_patch.go`).
fn json_patch_type() -> Ty {
    Ty::object(
        "JSONPatch",
        &[
            ("op", Ty::String),
            ("path", Ty::String),
            ("from", Ty::String),
            ("value", Ty::Dyn),
        ],
    )
}

/// Functions of the Kubernetes CEL libraries and cel-go extensions enabled in
/// the API server's base environment (`pkg/cel/environment/base.go`), with a
/// loose result type. Receiver-style and global names alike.
fn library_function(name: &str) -> Option<Ty> {
    Some(match name {
        "lowerAscii" | "upperAscii" | "trim" | "replace" | "substring" | "charAt" | "format"
        | "join" | "quote" | "reverse" | "getScheme" | "getHost" | "getHostname" | "getPort"
        | "getEscapedPath" | "find" | "path" | "group" | "resource" | "subresource"
        | "namespace" | "name" | "reason" | "error" | "string" => Ty::String,
        "split" | "findAll" => Ty::list(Ty::String),
        "indexOf" | "lastIndexOf" | "size" | "int" | "prefixLength" | "family" | "sign"
        | "compareTo" | "asInteger" | "major" | "minor" | "patch" => Ty::Int,
        "isSorted"
        | "isURL"
        | "isQuantity"
        | "isInteger"
        | "isIP"
        | "isCIDR"
        | "isSemver"
        | "isLoopback"
        | "isUnspecified"
        | "isGlobalUnicast"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isCanonical"
        | "containsIP"
        | "containsCIDR"
        | "allowed"
        | "errored"
        | "isGreaterThan"
        | "isLessThan"
        | "hasValue"
        | "contains"
        | "startsWith"
        | "endsWith"
        | "matches"
        | "bool"
        | "equivalent"
        | "intersects" => Ty::Bool,
        "sum" | "min" | "max" | "url" | "getQuery" | "quantity" | "add" | "sub" | "ip" | "cidr"
        | "masked" | "semver" | "check" | "serviceAccount" | "fieldSelector" | "labelSelector"
        | "value" | "or" | "orValue" | "of" | "none" | "ofNonZeroValue" | "dyn" | "type"
        | "double" | "uint" | "bytes" | "duration" | "timestamp" | "asApproximateFloat"
        | "getHours" | "getMinutes" | "getSeconds" | "getMilliseconds" | "getDate"
        | "getDayOfMonth" | "getDayOfWeek" | "getDayOfYear" | "getFullYear" | "getMonth"
        | "greatest" | "least" | "ceil" | "floor" | "round" | "abs" | "encode" | "decode"
        | "escapeKey" | "named" | "flatten" | "distinct" | "range" | "slice" | "sort"
        | "sortBy" | "first" | "last" | "optMap" | "optFlatMap" | "unwrap" | "all" | "exists"
        | "exists_one" | "map" | "filter" => Ty::Dyn,
        _ => return None,
    })
}

/// Namespaces of library functions called as `ns.f(...)`.
const FUNCTION_NAMESPACES: &[&str] = &[
    "sets",
    "optional",
    "base64",
    "math",
    "strings",
    "jsonpatch",
    "format",
    "lists",
];

/// One checker error with the expression id it is about.
#[derive(Debug)]
struct Issue {
    id: u64,
    msg: String,
}

struct Checker<'a> {
    decls: &'a Decls,
    scopes: Vec<(String, Ty)>,
    issues: Vec<Issue>,
}

impl Checker<'_> {
    fn report(&mut self, id: u64, msg: String) -> Ty {
        self.issues.push(Issue { id, msg });
        Ty::Error
    }

    fn undeclared(&mut self, id: u64, name: &str) -> Ty {
        self.report(
            id,
            format!("undeclared reference to '{name}' (in container '')"),
        )
    }

    fn variable(&self, name: &str) -> Option<Ty> {
        if let Some((_, t)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return Some(t.clone());
        }
        Some(match name {
            "object" | "oldObject" => Ty::Dyn,
            "request" => request_type(),
            "namespaceObject" => namespace_type(),
            "params" if self.decls.params => Ty::Dyn,
            "authorizer" if self.decls.authorizer => {
                Ty::open("kubernetes.authorization.Authorizer")
            }
            "authorizer.requestResource" if self.decls.authorizer => {
                Ty::open("kubernetes.authorization.ResourceCheck")
            }
            "variables" => {
                let vars = self.decls.variables.as_ref()?;
                let fields: Vec<(&str, Ty)> =
                    vars.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                Ty::object("kubernetes.variables", &fields)
            }
            "int" | "uint" | "double" | "bool" | "string" | "bytes" | "list" | "map"
            | "null_type" | "type" | "dyn" => Ty::Type,
            _ => return None,
        })
    }

    /// A struct literal's type (`checkCreateStruct`): only `JSONPatch` and
    /// `Object`, `Object.<path>` exist, and only with the patch types.
    fn struct_type(&self, name: &str) -> Option<Ty> {
        if !self.decls.patch_types {
            return None;
        }
        if name == "JSONPatch" {
            return Some(json_patch_type());
        }
        (name == "Object" || name.starts_with("Object.")).then(|| Ty::open(name))
    }

    fn check(&mut self, e: &IdedExpr) -> Ty {
        match &e.expr {
            Expr::Unspecified => Ty::Dyn,
            Expr::Literal(l) => literal_type(l),
            Expr::Ident(name) => match self.variable(name) {
                Some(t) => t,
                None => self.undeclared(e.id, name),
            },
            Expr::Select(s) => self.check_select(e, s),
            Expr::List(l) => self.check_list(l),
            Expr::Map(m) => self.check_map(m),
            Expr::Struct(st) => self.check_struct(e.id, st),
            Expr::Comprehension(c) => self.check_comprehension(c),
            Expr::Call(call) => self.call(e.id, call),
        }
    }

    fn check_select(&mut self, e: &IdedExpr, s: &SelectExpr) -> Ty {
        // A qualified type name such as `Object.spec` is a type value.
        if self.decls.patch_types
            && let Some(name) = qualified_name(e)
            && name.split('.').next() == Some("Object")
            && self.variable("Object").is_none()
        {
            return Ty::Type;
        }
        let operand = self.check(&s.operand);
        let field = self.select(e.id, &operand, &s.field);
        if s.test { Ty::Bool } else { field }
    }

    fn check_list(&mut self, l: &ListExpr) -> Ty {
        let mut elem = Ty::Free;
        for x in &l.elements {
            let t = self.check(x);
            elem = self.join_elements(x.id, &elem, &t);
        }
        Ty::list(elem)
    }

    fn check_map(&mut self, m: &MapExpr) -> Ty {
        let (mut k, mut v) = (Ty::Free, Ty::Free);
        for entry in &m.entries {
            if let EntryExpr::MapEntry(me) = &entry.expr {
                let kt = self.check(&me.key);
                let vt = self.check(&me.value);
                k = self.join_elements(me.key.id, &k, &kt);
                v = self.join_elements(me.value.id, &v, &vt);
            }
        }
        Ty::map(k, v)
    }

    /// A struct literal: the values are checked even when the type is
    /// undeclared, then each field against the type's declaration.
    fn check_struct(&mut self, id: u64, st: &StructExpr) -> Ty {
        let Some(ty) = self.struct_type(&st.type_name) else {
            for entry in &st.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    self.check(&f.value);
                }
            }
            return self.undeclared(id, &st.type_name);
        };
        for entry in &st.entries {
            if let EntryExpr::StructField(f) = &entry.expr {
                let vt = self.check(&f.value);
                if let Some(msg) = struct_field_issue(&ty, &f.field, &vt) {
                    self.report(entry.id, msg);
                }
            }
        }
        ty
    }

    /// The range, then the accumulator, the loop with the variables in scope
    /// and the result with the accumulator alone.
    fn check_comprehension(&mut self, c: &ComprehensionExpr) -> Ty {
        let range = self.check(&c.iter_range);
        let (var1, var2) = match iteration_types(&range, c.iter_var2.is_some()) {
            Some(types) => types,
            None => {
                self.report(
                    c.iter_range.id,
                    format!(
                        "expression of type '{range}' cannot be range of a comprehension (must be list, map, or dynamic)"
                    ),
                );
                (Ty::Error, Ty::Error)
            }
        };
        let accu = self.check(&c.accu_init);
        let depth = self.scopes.len();
        self.scopes.push((c.accu_var.clone(), accu.clone()));
        self.scopes.push((c.iter_var.clone(), var1));
        if let Some(v2) = &c.iter_var2 {
            self.scopes.push((v2.clone(), var2));
        }
        self.check(&c.loop_cond);
        let step = self.check(&c.loop_step);
        let accu = join(&accu, &step);
        self.scopes.truncate(depth);
        self.scopes.push((c.accu_var.clone(), accu));
        let result = self.check(&c.result);
        self.scopes.truncate(depth);
        result
    }

    fn join_elements(&mut self, id: u64, prev: &Ty, t: &Ty) -> Ty {
        if assignable(prev, t) || assignable(t, prev) {
            join(prev, t)
        } else {
            // HomogeneousAggregateLiterals, on in the API server's base env.
            self.report(id, format!("expected type '{prev}' but found '{t}'"))
        }
    }

    fn select(&mut self, id: u64, operand: &Ty, field: &str) -> Ty {
        match operand {
            Ty::Object(o) => match &o.fields {
                None => Ty::Dyn,
                Some(fields) => match fields.get(field) {
                    Some(t) => t.clone(),
                    None => self.report(id, format!("undefined field '{field}'")),
                },
            },
            Ty::Map(k, v) if assignable(k, &Ty::String) => (**v).clone(),
            t if t.is_dyn() => Ty::Dyn,
            other => {
                let other = other.clone();
                self.report(
                    id,
                    format!("type '{other}' does not support field selection"),
                )
            }
        }
    }

    fn no_overload(&mut self, id: u64, name: &str, target: Option<&Ty>, args: &[Ty]) -> Ty {
        let list: Vec<String> = args.iter().map(ToString::to_string).collect();
        let sig = match target {
            Some(t) => format!("{t}.({})", list.join(", ")),
            None => format!("({})", list.join(", ")),
        };
        self.report(
            id,
            format!("found no matching overload for '{name}' applied to '{sig}'"),
        )
    }

    fn call(&mut self, id: u64, call: &CallExpr) -> Ty {
        let name = call.func_name.as_str();
        // `ns.f(...)`: a namespaced library function, not a receiver call.
        if let Some(t) = &call.target
            && let Expr::Ident(ns) = &t.expr
            && FUNCTION_NAMESPACES.contains(&ns.as_str())
            && self.variable(ns).is_none()
        {
            for a in &call.args {
                self.check(a);
            }
            return namespaced_function_type(name);
        }
        let target = call.target.as_ref().map(|t| self.check(t));
        let args: Vec<Ty> = call.args.iter().map(|a| self.check(a)).collect();
        if args.iter().chain(target.iter()).any(|t| *t == Ty::Error) {
            return Ty::Error;
        }
        match core_overload(name, target.as_ref(), &args) {
            Overload::Typed(t) => t,
            Overload::NoMatch => self.no_overload(id, name, target.as_ref(), &args),
            Overload::NotCore => match library_function(name) {
                Some(t) => t,
                None => self.undeclared(id, name),
            },
        }
    }
}

fn literal_type(l: &LiteralValue) -> Ty {
    match l {
        LiteralValue::Boolean(_) => Ty::Bool,
        LiteralValue::Bytes(_) => Ty::Bytes,
        LiteralValue::Double(_) => Ty::Double,
        LiteralValue::Int(_) => Ty::Int,
        LiteralValue::Null => Ty::Null,
        LiteralValue::String(_) => Ty::String,
        LiteralValue::UInt(_) => Ty::Uint,
    }
}

/// What is wrong with setting `field` of a struct literal of type `ty` to a
/// value of type `value`, if anything (only declared fields are known).
fn struct_field_issue(ty: &Ty, field: &str, value: &Ty) -> Option<String> {
    let Ty::Object(o) = ty else {
        return None;
    };
    match o.fields.as_ref()?.get(field) {
        None => Some(format!("undefined field '{field}'")),
        Some(ft) if !assignable(ft, value) => Some(format!(
            "expected type of field '{field}' is '{ft}' but provided type is '{value}'"
        )),
        Some(_) => None,
    }
}

/// The types of a comprehension's two variables over `range`: a list's
/// element (or index and element with two variables), a map's key and value;
/// `None` when `range` cannot be iterated.
fn iteration_types(range: &Ty, two_variables: bool) -> Option<(Ty, Ty)> {
    Some(match range {
        Ty::List(elem) => (
            if two_variables {
                Ty::Int
            } else {
                (**elem).clone()
            },
            (**elem).clone(),
        ),
        Ty::Map(k, v) => ((**k).clone(), (**v).clone()),
        t if t.is_dyn() => (Ty::Dyn, Ty::Dyn),
        Ty::Error => (Ty::Error, Ty::Error),
        _ => return None,
    })
}

/// The result of `ns.f(...)`, a function of a library namespace.
fn namespaced_function_type(name: &str) -> Ty {
    match name {
        "encode" | "escapeKey" => Ty::String,
        "decode" => Ty::Bytes,
        _ => library_function(name).unwrap_or(Ty::Dyn),
    }
}

/// What the core operators and functions make of a call's argument types.
enum Overload {
    /// The result type of the overload that takes them.
    Typed(Ty),
    /// A core function, but no overload takes these types.
    NoMatch,
    /// Not a core function of this shape: a library function, if any.
    NotCore,
}

fn typed_if(ok: bool, t: Ty) -> Overload {
    if ok {
        Overload::Typed(t)
    } else {
        Overload::NoMatch
    }
}

/// A `dyn` among the argument types.
fn any_dyn(ts: &[Ty]) -> bool {
    ts.iter().any(Ty::is_dyn)
}

/// The overloads of some of the core functions.
type OverloadGroup = fn(&str, Option<&Ty>, &[Ty]) -> Overload;

/// The core overloads for a call of `name`.
fn core_overload(name: &str, target: Option<&Ty>, args: &[Ty]) -> Overload {
    // Each group takes names of its own, so their order does not matter.
    let groups: [OverloadGroup; 3] = [logic_overload, arithmetic_overload, function_overload];
    for group in groups {
        match group(name, target, args) {
            Overload::NotCore => {}
            found => return found,
        }
    }
    Overload::NotCore
}

/// The logical, comparison, conditional, index and `in` operators.
fn logic_overload(name: &str, target: Option<&Ty>, args: &[Ty]) -> Overload {
    match (name, target, args) {
        (op::LOGICAL_AND | op::LOGICAL_OR, None, [a, b]) => typed_if(
            assignable(&Ty::Bool, a) && assignable(&Ty::Bool, b),
            Ty::Bool,
        ),
        (op::LOGICAL_NOT | op::NOT_STRICTLY_FALSE, None, [a]) => {
            typed_if(assignable(&Ty::Bool, a), Ty::Bool)
        }
        (op::EQUALS | op::NOT_EQUALS, None, [a, b]) => typed_if(
            assignable(a, b) || assignable(b, a) || (a.is_numeric() && b.is_numeric()),
            Ty::Bool,
        ),
        (op::LESS | op::LESS_EQUALS | op::GREATER | op::GREATER_EQUALS, None, [a, b]) => {
            let ordered = |t: &Ty| {
                t.is_numeric()
                    || matches!(
                        t,
                        Ty::String | Ty::Bytes | Ty::Bool | Ty::Duration | Ty::Timestamp
                    )
            };
            typed_if(
                any_dyn(args) || (a.is_numeric() && b.is_numeric()) || (a == b && ordered(a)),
                Ty::Bool,
            )
        }
        (op::CONDITIONAL, None, [c, a, b]) => {
            if !assignable(&Ty::Bool, c) {
                Overload::NoMatch
            } else if assignable(a, b) || assignable(b, a) {
                Overload::Typed(join(a, b))
            } else {
                Overload::NoMatch
            }
        }
        (op::INDEX, None, [c, i]) => match c {
            Ty::List(elem) if matches!(i, Ty::Int | Ty::Uint) || i.is_dyn() => {
                Overload::Typed((**elem).clone())
            }
            Ty::Map(k, v) if assignable(k, i) => Overload::Typed((**v).clone()),
            t if t.is_dyn() => Overload::Typed(Ty::Dyn),
            _ => Overload::NoMatch,
        },
        (op::IN, None, [x, c]) => match c {
            Ty::List(elem) if assignable(elem, x) => Overload::Typed(Ty::Bool),
            Ty::Map(k, _) if assignable(k, x) => Overload::Typed(Ty::Bool),
            t if t.is_dyn() => Overload::Typed(Ty::Bool),
            _ => Overload::NoMatch,
        },
        _ => Overload::NotCore,
    }
}

/// Negation and the arithmetic operators.
fn arithmetic_overload(name: &str, target: Option<&Ty>, args: &[Ty]) -> Overload {
    match (name, target, args) {
        (op::NEGATE, None, [a]) => match a {
            Ty::Int | Ty::Double | Ty::Duration => Overload::Typed(a.clone()),
            t if t.is_dyn() => Overload::Typed(Ty::Dyn),
            _ => Overload::NoMatch,
        },
        (op::ADD, None, [a, b]) => match (a, b) {
            (Ty::List(_), Ty::List(_)) if assignable(a, b) || assignable(b, a) => {
                Overload::Typed(join(a, b))
            }
            (Ty::Timestamp, Ty::Duration) | (Ty::Duration, Ty::Timestamp) => {
                Overload::Typed(Ty::Timestamp)
            }
            _ if a == b
                && matches!(
                    a,
                    Ty::Int | Ty::Uint | Ty::Double | Ty::String | Ty::Bytes | Ty::Duration
                ) =>
            {
                Overload::Typed(a.clone())
            }
            _ if any_dyn(args) => {
                if a.is_dyn() {
                    Overload::Typed(b.clone())
                } else {
                    Overload::Typed(a.clone())
                }
            }
            _ => Overload::NoMatch,
        },
        (op::SUBSTRACT | op::MULTIPLY | op::DIVIDE | op::MODULO, None, [a, b]) => {
            if a == b && (a.is_numeric() || (name == op::SUBSTRACT && *a == Ty::Duration)) {
                Overload::Typed(a.clone())
            } else if name == op::SUBSTRACT && *a == Ty::Timestamp {
                match b {
                    Ty::Timestamp => Overload::Typed(Ty::Duration),
                    Ty::Duration => Overload::Typed(Ty::Timestamp),
                    _ => Overload::NoMatch,
                }
            } else if any_dyn(args) {
                if a.is_dyn() {
                    Overload::Typed(b.clone())
                } else {
                    Overload::Typed(a.clone())
                }
            } else {
                Overload::NoMatch
            }
        }
        _ => Overload::NotCore,
    }
}

/// `size` and the string predicates.
fn function_overload(name: &str, target: Option<&Ty>, args: &[Ty]) -> Overload {
    match (name, target, args) {
        ("size", t, a) => {
            let subject = match (t, a) {
                (Some(t), []) | (None, [t]) => t,
                _ => return Overload::NoMatch,
            };
            match subject {
                Ty::String | Ty::Bytes | Ty::List(_) | Ty::Map(..) => Overload::Typed(Ty::Int),
                s if s.is_dyn() => Overload::Typed(Ty::Int),
                _ => Overload::NoMatch,
            }
        }
        ("contains" | "startsWith" | "endsWith" | "matches", Some(t), [a]) => {
            let string_like = |x: &Ty| matches!(x, Ty::String) || x.is_dyn();
            // `contains` is also the library's list and authorizer helper.
            typed_if(
                (string_like(t) && string_like(a))
                    || (name == "contains" && !matches!(t, Ty::String)),
                Ty::Bool,
            )
        }
        _ => Overload::NotCore,
    }
}

/// `a.b.c` spelled by selections on an identifier.
fn qualified_name(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        Expr::Select(s) if !s.test => Some(format!("{}.{}", qualified_name(&s.operand)?, s.field)),
        _ => None,
    }
}

/// cel-go's display of one issue: position (1-based column), message, the
/// source line and a caret under the column.
fn display(source: &str, info: &SourceInfo, issue: &Issue) -> String {
    let offset = info
        .offset_for(issue.id)
        .map_or(0, |(start, _)| start as usize);
    let mut line_no = 1;
    let mut line_start = 0;
    for (i, c) in source.char_indices() {
        if i >= offset {
            break;
        }
        if c == '\n' {
            line_no += 1;
            line_start = i + 1;
        }
    }
    let column = source[line_start..offset.min(source.len())].chars().count();
    let line = source[line_start..].lines().next().unwrap_or_default();
    format!(
        "ERROR: <input>:{line_no}:{}: {}\n | {}\n | {}^",
        column + 1,
        issue.msg,
        line.replace('\t', " "),
        ".".repeat(column)
    )
}

/// Compiles `expression` as the API server would for an expression kind:
/// `Ok(output type)` or the error detail ("compilation failed: ERROR: …").
pub fn compile(expression: &str, decls: &Decls, output: Output) -> Result<Ty, String> {
    let (ast, info) = cel::parser::Parser::default()
        .enable_optional_syntax(true)
        .parse_with_source_info(expression)
        .map_err(|e| format!("compilation failed: {}", parse_errors(&e)))?;
    let mut checker = Checker {
        decls,
        scopes: Vec::new(),
        issues: Vec::new(),
    };
    let ty = checker.check(&ast);
    if !checker.issues.is_empty() {
        let shown: Vec<String> = checker
            .issues
            .iter()
            .map(|i| display(expression, &info, i))
            .collect();
        return Err(format!("compilation failed: {}", shown.join("\n")));
    }
    let wanted = match output {
        Output::Any => return Ok(ty),
        Output::Bool => Ty::Bool,
        Output::String => Ty::String,
        Output::StringOrNull if matches!(ty, Ty::String | Ty::Null) => return Ok(ty),
        Output::StringOrNull => {
            return Err(format!(
                "must evaluate to one of [string null_type] but got {ty}"
            ));
        }
        Output::JsonPatches => Ty::list(json_patch_type()),
        Output::ApplyConfiguration => Ty::open("Object"),
    };
    // `CompileCELExpression` wants the exact type (`IsExactType`): a dyn
    // result, such as a field of `object`, is not a bool.
    if ty == wanted {
        Ok(ty)
    } else {
        Err(format!("must evaluate to {wanted} but got {ty}"))
    }
}

/// The type a compiled variable gets as a field of `variables`
/// (`convertCelTypeToDeclType`): primitives, lists and maps as they are,
/// anything else dyn.
pub fn variable_field_type(t: &Ty) -> Ty {
    match t {
        Ty::Bool | Ty::Int | Ty::Uint | Ty::Double | Ty::String | Ty::Bytes | Ty::Null => t.clone(),
        Ty::Duration | Ty::Timestamp => t.clone(),
        Ty::List(e) => Ty::list(variable_field_type(e)),
        Ty::Map(k, v) => Ty::map(variable_field_type(k), variable_field_type(v)),
        _ => Ty::Dyn,
    }
}

fn parse_errors(e: &cel::ParseErrors) -> String {
    // The `cel` crate prints "| line" where cel-go prints " | line".
    e.to_string().replace("\n| ", "\n | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mutation() -> Decls {
        Decls {
            patch_types: true,
            variables: Some(vec![(
                "missing".into(),
                Ty::list(Ty::map(Ty::String, Ty::String)),
            )]),
            ..Decls::default()
        }
    }

    fn plain() -> Decls {
        Decls {
            variables: Some(Vec::new()),
            ..Decls::default()
        }
    }

    #[test]
    fn object_literals_are_undeclared_outside_mutations() {
        let expr = "[Object.spec.taints{key: 'k', effect: 'NoSchedule'}].filter(t, true)";
        let e = compile(expr, &plain(), Output::Any).unwrap_err();
        assert!(
            e.starts_with(
                "compilation failed: ERROR: <input>:1:20: undeclared reference to 'Object.spec.taints' (in container '')\n | [Object"
            ),
            "{e}"
        );
        assert!(e.ends_with(&format!(" | {}^", ".".repeat(19))), "{e}");
        assert!(compile(expr, &mutation(), Output::Any).is_ok());
    }

    #[test]
    fn jsonpatch_fields_and_output_are_checked() {
        let d = mutation();
        let ok = "variables.missing.map(t, JSONPatch{op: 'add', path: '/spec/taints/-', value: t})";
        assert_eq!(
            compile(ok, &d, Output::JsonPatches).unwrap(),
            Ty::list(json_patch_type())
        );
        let e = compile("[JSONPatch{op: 'add', valu: 1}]", &d, Output::JsonPatches).unwrap_err();
        assert!(e.contains("undefined field 'valu'"), "{e}");
        let e = compile("[JSONPatch{op: 1}]", &d, Output::JsonPatches).unwrap_err();
        assert!(
            e.contains("expected type of field 'op' is 'string' but provided type is 'int'"),
            "{e}"
        );
        let e = compile("['a']", &d, Output::JsonPatches).unwrap_err();
        assert_eq!(e, "must evaluate to list(JSONPatch) but got list(string)");
        assert!(
            compile(
                "true ? [] : [JSONPatch{op: 'add'}]",
                &d,
                Output::JsonPatches
            )
            .is_ok()
        );
        assert!(
            compile("JSONPatch{op: 'add'}", &plain(), Output::Any)
                .unwrap_err()
                .contains("undeclared reference to 'JSONPatch'")
        );
    }

    #[test]
    fn typed_request_and_variables_refuse_unknown_fields() {
        let e = compile("request.uid == ''", &plain(), Output::Bool).unwrap_err();
        assert!(
            e.contains("ERROR: <input>:1:8: undefined field 'uid'"),
            "{e}"
        );
        assert!(
            compile(
                "request.userInfo.extra['a'][0] == 'x'",
                &plain(),
                Output::Bool
            )
            .is_ok()
        );
        let e = compile("size(variables.nope) == 0", &mutation(), Output::Bool).unwrap_err();
        assert!(e.contains("undefined field 'nope'"), "{e}");
        assert!(compile("size(variables.missing) == 0", &mutation(), Output::Bool).is_ok());
        // `variables` is not declared where there is no composition.
        let none = Decls::default();
        assert!(
            compile("variables.a", &none, Output::Any)
                .unwrap_err()
                .contains("undeclared reference to 'variables'")
        );
    }

    #[test]
    fn optional_variables_exist_only_when_declared() {
        for (expr, decls) in [
            ("params.x == 1", Decls::default()),
            (
                "authorizer.group('').check('get').allowed()",
                Decls::default(),
            ),
        ] {
            assert!(compile(expr, &decls, Output::Bool).is_err(), "{expr}");
        }
        let all = Decls {
            params: true,
            authorizer: true,
            ..Decls::default()
        };
        assert!(compile("params.x == 1", &all, Output::Bool).is_ok());
        assert!(
            compile(
                "authorizer.group('').resource('nodes').check('get').allowed()",
                &all,
                Output::Bool
            )
            .is_ok()
        );
    }

    #[test]
    fn type_errors_and_output_types() {
        let e = compile("1 == 'a'", &plain(), Output::Bool).unwrap_err();
        assert!(
            e.contains("found no matching overload for '_==_' applied to '(int, string)'"),
            "{e}"
        );
        assert_eq!(
            compile("'a'", &plain(), Output::Bool).unwrap_err(),
            "must evaluate to bool but got string"
        );
        // Exact types: a field of `object` is dyn, not bool.
        assert_eq!(
            compile("object.spec.unschedulable", &plain(), Output::Bool).unwrap_err(),
            "must evaluate to bool but got dyn"
        );
        assert!(compile("object.spec.unschedulable == true", &plain(), Output::Bool).is_ok());
        assert!(
            compile(
                "'node ' + string(object.metadata.name)",
                &plain(),
                Output::String
            )
            .is_ok()
        );
        assert!(
            compile(
                "namespaceObject.metadata.labels['a'] == 'b'",
                &plain(),
                Output::Bool
            )
            .is_ok()
        );
        assert!(
            compile(
                "namespaceObject.metadata.nope == 'b'",
                &plain(),
                Output::Bool
            )
            .is_err()
        );
        let e = compile("[1, 'a']", &plain(), Output::Any).unwrap_err();
        assert!(e.contains("expected type 'int' but found 'string'"), "{e}");
        let e = compile("nosuchfn(1)", &plain(), Output::Any).unwrap_err();
        assert!(e.contains("undeclared reference to 'nosuchfn'"), "{e}");
        assert!(
            compile(
                "object.metadata.name.lowerAscii().startsWith('a')",
                &plain(),
                Output::Bool
            )
            .is_ok()
        );
        assert!(compile("sets.contains(['a'], ['a'])", &plain(), Output::Bool).is_ok());
    }

    #[test]
    fn parse_errors_are_compilation_failures() {
        let e = compile("object.", &plain(), Output::Any).unwrap_err();
        assert!(
            e.starts_with("compilation failed: ERROR: <input>:1:"),
            "{e}"
        );
    }

    #[test]
    fn comprehension_variables_are_scoped() {
        assert!(compile("[1, 2].all(x, x > 0)", &plain(), Output::Bool).is_ok());
        let e = compile("[1].all(x, x > 0) && x > 0", &plain(), Output::Bool).unwrap_err();
        assert!(e.contains("undeclared reference to 'x'"), "{e}");
        let e = compile("[1].exists(x, x == 'a')", &plain(), Output::Bool).unwrap_err();
        assert!(e.contains("'(int, string)'"), "{e}");
        assert_eq!(
            compile("{'a': 1}.map(k, k)", &plain(), Output::Any).unwrap(),
            Ty::list(Ty::String)
        );
    }
}
