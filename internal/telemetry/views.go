package telemetry

import (
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// httpServerKeys are the attributes the HTTP server metrics keep: the
// ones whose values the server bounds. otelhttp also sets server.address
// and server.port from the request's Host header and
// network.protocol.version from its request line, which a caller of the
// unauthenticated /metrics, or of any route, chooses freely: every made-up
// Host was a new series of each histogram (issue 31: 600 requests added
// 31,800 series). The method is one of the standard ones or _OTHER, the
// route a registered pattern (internal/server), the status one the server
// wrote. Being an allow-list, an attribute a later otelhttp adds is
// dropped until it is judged bounded.
var httpServerKeys = []attribute.Key{
	"http.request.method",
	"http.response.status_code",
	"http.route",
	"url.scheme",
	"network.protocol.name",
	"error.type",
}

// views are the views of the MeterProvider Install builds.
func views() []sdkmetric.View {
	return []sdkmetric.View{
		sdkmetric.NewView(
			sdkmetric.Instrument{Name: "http.server.*", Scope: instrumentation.Scope{Name: otelhttp.ScopeName}},
			sdkmetric.Stream{AttributeFilter: attribute.NewAllowKeysFilter(httpServerKeys...)},
		),
	}
}
