//! The gateway's routes, built and listed by the same code: [`Routes`] adds
//! each route to the axum router and records its path, methods and
//! listener, so the list ([`RouteInfo`], on `crate::gateway::RunningGateway`) is
//! the router itself, never a copy kept by hand. tests/adversary.rs reads
//! it and fails for a route its attack table does not cover.
//!
//! [`get`], [`post`], [`put`], [`patch`] and [`delete`] stand in for
//! axum's functions of the same names (and chain the same way), noting
//! each method as they add it.

use axum::handler::Handler;
use axum::routing::MethodRouter;
use axum::Router;

/// The gateway's public listener (`gateway --listen`).
pub const PUBLIC: &str = "public";
/// The operators' listener (`gateway.admin_addr`).
pub const ADMIN: &str = "admin";

/// One route of a gateway listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    /// The listener that serves it ([`PUBLIC`], ...).
    pub listener: &'static str,
    /// The path as the router matches it (`/v1/groups/{topic}`); the
    /// fallback of a router is [`FALLBACK`].
    pub path: &'static str,
    /// The methods it answers, upper case (`GET` also answers `HEAD`); a
    /// fallback answers any.
    pub methods: Vec<&'static str>,
    /// The setting it needs (`gateway.webapp_dir`), if any.
    pub when: Option<&'static str>,
    /// Whether this gateway serves it (false: `when` is not set).
    pub served: bool,
}

/// The path recorded for a router's fallback (whatever no route matched).
pub const FALLBACK: &str = "{fallback}";

/// The handlers of one path and the methods they answer.
pub struct Methods<S> {
    router: MethodRouter<S>,
    methods: Vec<&'static str>,
}

macro_rules! methods {
    ($($name:ident => $method:literal),* $(,)?) => {
        $(
            #[doc = concat!("A `", $method, "` handler, recorded (axum's `", stringify!($name), "`).")]
            pub fn $name<H, T, S>(handler: H) -> Methods<S>
            where
                H: Handler<T, S>,
                T: 'static,
                S: Clone + Send + Sync + 'static,
            {
                Methods {
                    router: axum::routing::$name(handler),
                    methods: vec![$method],
                }
            }
        )*

        impl<S: Clone + Send + Sync + 'static> Methods<S> {
            $(
                #[doc = concat!("Adds a `", $method, "` handler to the same path.")]
                pub fn $name<H, T>(mut self, handler: H) -> Self
                where
                    H: Handler<T, S>,
                    T: 'static,
                {
                    self.router = self.router.$name(handler);
                    self.methods.push($method);
                    self
                }
            )*
        }
    };
}

methods!(get => "GET", post => "POST", put => "PUT", patch => "PATCH", delete => "DELETE");

/// A router under construction and the list of what it serves.
pub struct Routes<S = ()> {
    router: Router<S>,
    listener: &'static str,
    when: Option<&'static str>,
    list: Vec<RouteInfo>,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub fn new(listener: &'static str) -> Self {
        Routes {
            router: Router::new(),
            listener,
            when: None,
            list: Vec::new(),
        }
    }

    /// The routes added after this need `setting`.
    pub fn when(mut self, setting: &'static str) -> Self {
        self.when = Some(setting);
        self
    }

    fn record(&mut self, path: &'static str, methods: Vec<&'static str>) {
        self.list.push(RouteInfo {
            listener: self.listener,
            path,
            methods,
            when: self.when,
            served: true,
        });
    }

    pub fn route(mut self, path: &'static str, methods: Methods<S>) -> Self {
        self.router = self.router.route(path, methods.router);
        self.record(path, methods.methods);
        self
    }

    /// What answers a request no route matched.
    pub fn fallback<H, T>(mut self, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.router = self.router.fallback(handler);
        self.record(FALLBACK, vec!["ANY"]);
        self
    }

    pub fn with_state<S2: Clone + Send + Sync + 'static>(self, state: S) -> Routes<S2> {
        Routes {
            router: self.router.with_state(state),
            listener: self.listener,
            when: self.when,
            list: self.list,
        }
    }

    /// Applies `f` to the router (a layer); the list stays as it is.
    pub fn map_router(mut self, f: impl FnOnce(Router<S>) -> Router<S>) -> Self {
        self.router = f(self.router);
        self
    }

    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.list.extend(other.list);
        self
    }

    /// Lists `other`'s routes as not served here (their setting is off).
    pub fn not_served<T>(mut self, other: Routes<T>) -> Self {
        self.list.extend(
            other
                .list
                .into_iter()
                .map(|r| RouteInfo { served: false, ..r }),
        );
        self
    }

    pub fn into_parts(self) -> (Router<S>, Vec<RouteInfo>) {
        (self.router, self.list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_is_listed_with_its_methods_and_setting() {
        let (_, list) = Routes::<()>::new(PUBLIC)
            .route("/a/{x}", get(|| async {}).post(|| async {}))
            .merge(
                Routes::new(PUBLIC)
                    .when("some.setting")
                    .route("/b", delete(|| async {})),
            )
            .not_served(Routes::<()>::new(PUBLIC).fallback(|| async {}))
            .into_parts();
        let shown: Vec<_> = list
            .iter()
            .map(|r| (r.path, r.methods.clone(), r.when, r.served))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("/a/{x}", vec!["GET", "POST"], None, true),
                ("/b", vec!["DELETE"], Some("some.setting"), true),
                (FALLBACK, vec!["ANY"], None, false),
            ]
        );
    }
}
