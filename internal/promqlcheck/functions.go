package promqlcheck

// function is a function's signature.
type function struct {
	args []Type
	ret  Type
}

// functions are the PromQL functions the checker knows (Prometheus 2.x and
// 3.x, stable ones).
var functions = map[string]function{}

// optionalArgs counts a function's trailing optional arguments; variadic
// functions repeat their last argument.
var (
	optionalArgs = map[string]int{
		"round": 1, "label_join": 1, "vector": 0,
		"days_in_month": 1, "day_of_month": 1, "day_of_week": 1, "day_of_year": 1,
		"hour": 1, "minute": 1, "month": 1, "year": 1,
	}
	variadic = map[string]bool{"label_join": true}
)

// aggregations are the aggregation operators and the arguments they take.
var aggregations = map[string][]Type{
	"sum": {Vector}, "avg": {Vector}, "min": {Vector}, "max": {Vector}, "count": {Vector},
	"stddev": {Vector}, "stdvar": {Vector}, "group": {Vector},
	"topk": {Scalar, Vector}, "bottomk": {Scalar, Vector}, "quantile": {Scalar, Vector},
	"count_values": {String, Vector},
}

func init() {
	for _, n := range []string{"rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets",
		"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
		"last_over_time", "stddev_over_time", "stdvar_over_time", "present_over_time", "absent_over_time"} {
		functions[n] = function{[]Type{Matrix}, Vector}
	}
	for _, n := range []string{"abs", "ceil", "floor", "exp", "ln", "log2", "log10", "sqrt", "sgn",
		"absent", "sort", "sort_desc", "timestamp", "histogram_count", "histogram_sum", "histogram_avg",
		"acos", "asin", "atan", "cos", "sin", "tan", "deg", "rad"} {
		functions[n] = function{[]Type{Vector}, Vector}
	}
	for _, n := range []string{"days_in_month", "day_of_month", "day_of_week", "day_of_year",
		"hour", "minute", "month", "year"} {
		functions[n] = function{[]Type{Vector}, Vector}
	}
	functions["quantile_over_time"] = function{[]Type{Scalar, Matrix}, Vector}
	functions["predict_linear"] = function{[]Type{Matrix, Scalar}, Vector}
	functions["holt_winters"] = function{[]Type{Matrix, Scalar, Scalar}, Vector}
	functions["histogram_quantile"] = function{[]Type{Scalar, Vector}, Vector}
	functions["histogram_fraction"] = function{[]Type{Scalar, Scalar, Vector}, Vector}
	functions["round"] = function{[]Type{Vector, Scalar}, Vector}
	functions["clamp"] = function{[]Type{Vector, Scalar, Scalar}, Vector}
	functions["clamp_min"] = function{[]Type{Vector, Scalar}, Vector}
	functions["clamp_max"] = function{[]Type{Vector, Scalar}, Vector}
	functions["scalar"] = function{[]Type{Vector}, Scalar}
	functions["vector"] = function{[]Type{Scalar}, Vector}
	functions["time"] = function{nil, Scalar}
	functions["pi"] = function{nil, Scalar}
	functions["label_replace"] = function{[]Type{Vector, String, String, String, String}, Vector}
	functions["label_join"] = function{[]Type{Vector, String, String, String}, Vector}
}
