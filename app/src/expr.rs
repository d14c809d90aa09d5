//! The demo's "write your own" language: one line such as `gelu(x*1.5+0.5)*sigmoid(x)`, parsed into
//! kiln tensor ops, so a visitor can watch kiln trace, fuse and lower something they wrote. Operators
//! `+ - * /` (elementwise, PyTorch broadcasting), `@` (matmul), unary `-`, parentheses, numbers, the
//! inputs [`INPUTS`] and the functions [`FUNCTIONS`]. Bad input is a [`ParseError`] naming the column;
//! shape errors come from kiln itself when the expression runs.

use kiln::{DType, Tensor};

/// The inputs an expression may name, with their shapes.
pub const INPUTS: [(&str, &[usize]); 4] =
    [("x", &[256, 1024]), ("y", &[256, 1024]), ("b", &[1024]), ("w", &[1024, 256])];

/// The functions an expression may call: name, number of arguments, what it does.
pub const FUNCTIONS: [(&str, usize, &str); 22] = [
    ("exp", 1, "eˣ"),
    ("log", 1, "natural log"),
    ("sqrt", 1, "square root"),
    ("rsqrt", 1, "1/√x"),
    ("abs", 1, "|x|"),
    ("sin", 1, "sine"),
    ("cos", 1, "cosine"),
    ("tanh", 1, "tanh"),
    ("erf", 1, "error function"),
    ("sigmoid", 1, "1/(1+e⁻ˣ)"),
    ("relu", 1, "max(x, 0)"),
    ("gelu", 1, "GELU (erf)"),
    ("silu", 1, "x·sigmoid(x)"),
    ("softmax", 1, "softmax over the last dim"),
    ("log_softmax", 1, "log-softmax over the last dim"),
    ("sum", 1, "sum over the last dim (kept as size 1)"),
    ("mean", 1, "mean over the last dim (kept as size 1)"),
    ("amax", 1, "max over the last dim (kept as size 1)"),
    ("maximum", 2, "elementwise max"),
    ("minimum", 2, "elementwise min"),
    ("pow", 2, "aᵇ"),
    ("where_pos", 3, "where(a > 0, b, c)"),
];

/// Why a line is not an expression: the column (1-based, in characters) and what was wrong there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Where, counting characters from 1.
    pub column: usize,
    /// What was expected or found.
    pub msg: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "column {}: {}", self.column, self.msg)
    }
}

impl std::error::Error for ParseError {}

/// A parsed expression.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    /// The line as written.
    pub text: String,
    root: Node,
    /// The inputs it names, as indices into [`INPUTS`], in the order the compiled function takes them.
    pub inputs: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Number(f64),
    Input(usize),
    Neg(Box<Node>),
    Binary(char, Box<Node>, Box<Node>),
    Call(usize, Vec<Node>),
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Number(f64),
    Name(String),
    Symbol(char),
    End,
}

/// Splits a line into tokens, each with its 1-based column.
fn tokens(line: &str) -> Result<Vec<(Token, usize)>, ParseError> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            // An exponent: 1e-3, 2.5E+4.
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let text: String = chars[start..i].iter().collect();
            let value =
                text.parse::<f64>().map_err(|_| ParseError { column, msg: format!("`{text}` is not a number") })?;
            out.push((Token::Number(value), column));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Token::Name(chars[start..i].iter().collect()), column));
        } else if "+-*/@(),".contains(c) {
            out.push((Token::Symbol(c), column));
            i += 1;
        } else {
            return Err(ParseError {
                column,
                msg: format!("`{c}` is not part of the language (operators: + - * / @)"),
            });
        }
    }
    out.push((Token::End, chars.len() + 1));
    Ok(out)
}

/// A recursive-descent parser over the tokens: `sum := product (('+'|'-') product)*`,
/// `product := unary (('*'|'/'|'@') unary)*`, `unary := '-' unary | atom`,
/// `atom := number | input | function '(' sum (',' sum)* ')' | '(' sum ')'`.
struct Parser {
    tokens: Vec<(Token, usize)>,
    at: usize,
    inputs: Vec<usize>,
    /// Nesting so far: a line of thousands of `(` must be an error, not a stack overflow in the page.
    depth: usize,
}

/// The deepest nesting of parentheses, calls and unary minus a line may have.
const MAX_DEPTH: usize = 64;

impl Parser {
    fn peek(&self) -> &(Token, usize) {
        &self.tokens[self.at.min(self.tokens.len() - 1)]
    }

    fn next(&mut self) -> (Token, usize) {
        let t = self.peek().clone();
        self.at += 1;
        t
    }

    fn found(t: &Token) -> String {
        match t {
            Token::Number(n) => format!("the number {n}"),
            Token::Name(n) => format!("`{n}`"),
            Token::Symbol(c) => format!("`{c}`"),
            Token::End => "the end of the line".into(),
        }
    }

    fn sum(&mut self) -> Result<Node, ParseError> {
        let mut lhs = self.product()?;
        while let (Token::Symbol(op @ ('+' | '-')), _) = self.peek().clone() {
            self.next();
            lhs = Node::Binary(op, Box::new(lhs), Box::new(self.product()?));
        }
        Ok(lhs)
    }

    fn product(&mut self) -> Result<Node, ParseError> {
        let mut lhs = self.unary()?;
        while let (Token::Symbol(op @ ('*' | '/' | '@')), _) = self.peek().clone() {
            self.next();
            lhs = Node::Binary(op, Box::new(lhs), Box::new(self.unary()?));
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Node, ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ParseError { column: self.peek().1, msg: format!("nested more than {MAX_DEPTH} deep") });
        }
        let node = if self.peek().0 == Token::Symbol('-') {
            self.next();
            self.unary().map(|n| Node::Neg(Box::new(n)))
        } else {
            self.atom()
        };
        self.depth -= 1;
        node
    }

    fn expect(&mut self, want: char) -> Result<(), ParseError> {
        match self.next() {
            (Token::Symbol(c), _) if c == want => Ok(()),
            (t, column) => Err(ParseError { column, msg: format!("expected `{want}`, found {}", Self::found(&t)) }),
        }
    }

    fn atom(&mut self) -> Result<Node, ParseError> {
        match self.next() {
            (Token::Number(n), _) => Ok(Node::Number(n)),
            (Token::Symbol('('), _) => {
                let inner = self.sum()?;
                self.expect(')')?;
                Ok(inner)
            }
            (Token::Name(name), column) => {
                if self.peek().0 == Token::Symbol('(') {
                    return self.call(&name, column);
                }
                let i = INPUTS.iter().position(|(n, _)| *n == name).ok_or_else(|| ParseError {
                    column,
                    msg: match FUNCTIONS.iter().any(|(f, _, _)| *f == name) {
                        true => format!("`{name}` is a function: call it, as in `{name}(x)`"),
                        false => format!("unknown input `{name}`; the inputs are {}", input_list()),
                    },
                })?;
                if !self.inputs.contains(&i) {
                    self.inputs.push(i);
                }
                Ok(Node::Input(i))
            }
            (t, column) => Err(ParseError {
                column,
                msg: format!("expected a number, an input or `(`, found {}", Self::found(&t)),
            }),
        }
    }

    fn call(&mut self, name: &str, column: usize) -> Result<Node, ParseError> {
        let f = FUNCTIONS.iter().position(|(n, _, _)| *n == name).ok_or_else(|| ParseError {
            column,
            msg: format!(
                "unknown function `{name}`; known: {}",
                FUNCTIONS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
            ),
        })?;
        self.expect('(')?;
        let mut args = vec![self.sum()?];
        while self.peek().0 == Token::Symbol(',') {
            self.next();
            args.push(self.sum()?);
        }
        self.expect(')')?;
        let want = FUNCTIONS[f].1;
        if args.len() != want {
            return Err(ParseError {
                column,
                msg: format!(
                    "`{name}` takes {want} argument{}, given {}",
                    if want == 1 { "" } else { "s" },
                    args.len()
                ),
            });
        }
        Ok(Node::Call(f, args))
    }
}

fn input_list() -> String {
    INPUTS.iter().map(|(n, s)| format!("{n} {s:?}")).collect::<Vec<_>>().join(", ")
}

impl Expr {
    /// Parses one line.
    pub fn parse(line: &str) -> Result<Expr, ParseError> {
        let mut p = Parser { tokens: tokens(line)?, at: 0, inputs: Vec::new(), depth: 0 };
        if p.peek().0 == Token::End {
            return Err(ParseError { column: 1, msg: "the line is empty: write an expression of x, y, b, w".into() });
        }
        let root = p.sum()?;
        let (t, column) = p.next();
        if t != Token::End {
            return Err(ParseError { column, msg: format!("expected an operator, found {}", Parser::found(&t)) });
        }
        if p.inputs.is_empty() {
            return Err(ParseError {
                column: 1,
                msg: format!("the expression uses no input; the inputs are {}", input_list()),
            });
        }
        Ok(Expr { text: line.trim().to_string(), root, inputs: p.inputs })
    }

    /// The specs of the inputs it names, in the order [`Expr::eval`] takes them.
    pub fn specs(&self) -> Vec<kiln::graph::TensorSpec> {
        self.inputs.iter().map(|&i| kiln::graph::workloads::f32s(INPUTS[i].1)).collect()
    }

    /// The inputs' names, in order.
    pub fn input_names(&self) -> Vec<&'static str> {
        self.inputs.iter().map(|&i| INPUTS[i].0).collect()
    }

    /// Applies the expression to `args` (one tensor per name in [`Expr::inputs`]): kiln ops, so under
    /// `compile` it traces into a graph.
    pub fn eval(&self, args: &[Tensor]) -> kiln::Result<Tensor> {
        match self.node(&self.root, args)? {
            Value::Tensor(t) => Ok(t),
            Value::Number(n) => Tensor::scalar(n, DType::F32),
        }
    }

    fn node(&self, n: &Node, args: &[Tensor]) -> kiln::Result<Value> {
        Ok(match n {
            Node::Number(v) => Value::Number(*v),
            Node::Input(i) => {
                let at = self.inputs.iter().position(|x| x == i).unwrap_or(0);
                Value::Tensor(args[at].clone())
            }
            Node::Neg(a) => match self.node(a, args)? {
                Value::Number(v) => Value::Number(-v),
                Value::Tensor(t) => Value::Tensor(t.neg()?),
            },
            Node::Binary(op, a, b) => binary(*op, self.node(a, args)?, self.node(b, args)?)?,
            Node::Call(f, a) => {
                let a: Vec<Tensor> = a.iter().map(|x| self.node(x, args)?.tensor()).collect::<kiln::Result<_>>()?;
                Value::Tensor(call(FUNCTIONS[*f].0, &a)?)
            }
        })
    }
}

/// A value while evaluating: numbers stay numbers until they meet a tensor (so `2*3` folds).
enum Value {
    Number(f64),
    Tensor(Tensor),
}

impl Value {
    fn tensor(self) -> kiln::Result<Tensor> {
        match self {
            Value::Tensor(t) => Ok(t),
            Value::Number(n) => Tensor::scalar(n, DType::F32),
        }
    }
}

fn binary(op: char, a: Value, b: Value) -> kiln::Result<Value> {
    if let (Value::Number(x), Value::Number(y)) = (&a, &b) {
        return Ok(Value::Number(match op {
            '+' => x + y,
            '-' => x - y,
            '*' => x * y,
            '/' => x / y,
            _ => {
                return Err(kiln::Error::Unsupported {
                    what: "`@` of two numbers".into(),
                    loc: kiln::SourceLoc::caller(),
                })
            }
        }));
    }
    let (a, b) = (a.tensor()?, b.tensor()?);
    Ok(Value::Tensor(match op {
        '+' => a.add(&b)?,
        '-' => a.sub(&b)?,
        '*' => a.mul(&b)?,
        '/' => a.div(&b)?,
        _ => a.matmul(&b)?,
    }))
}

fn call(name: &str, a: &[Tensor]) -> kiln::Result<Tensor> {
    let x = &a[0];
    match name {
        "exp" => x.exp(),
        "log" => x.log(),
        "sqrt" => x.sqrt(),
        "rsqrt" => x.rsqrt(),
        "abs" => x.abs(),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tanh" => x.tanh(),
        "erf" => x.erf(),
        "sigmoid" => x.sigmoid(),
        "relu" => x.relu(),
        "gelu" => x.gelu(),
        "silu" => x.silu(),
        "softmax" => x.softmax(-1),
        "log_softmax" => x.log_softmax(-1),
        "sum" => x.sum(&[-1], true),
        "mean" => x.mean(&[-1], true),
        "amax" => x.max(&[-1], true),
        "maximum" => x.maximum(&a[1]),
        "minimum" => x.minimum(&a[1]),
        "pow" => x.pow(&a[1]),
        "where_pos" => x.gt(0.0)?.where_(&a[1], &a[2]),
        other => unreachable!("`{other}` is in FUNCTIONS but not applied here"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column_of(line: &str) -> (usize, String) {
        let e = Expr::parse(line).expect_err(line);
        (e.column, e.msg)
    }

    #[test]
    fn the_issue_example_parses_with_precedence_and_runs_as_kiln_ops() {
        let e = Expr::parse("gelu(x*1.5+0.5)*sigmoid(x)").unwrap();
        assert_eq!(e.input_names(), ["x"]);
        let x = Tensor::from_slice(&[-1.0f32, 0.0, 2.0], &[3]).unwrap();
        let got: Vec<f32> = e.eval(std::slice::from_ref(&x)).unwrap().to_vec().unwrap();
        let want: Vec<f32> =
            x.mul(1.5).unwrap().add(0.5).unwrap().gelu().unwrap().mul(x.sigmoid().unwrap()).unwrap().to_vec().unwrap();
        assert_eq!(got, want);
        // `-` binds tighter than `*`, `*` than `+`, and numbers fold before meeting a tensor.
        let e = Expr::parse("2*3 + -x*2").unwrap();
        let got: Vec<f32> = e.eval(std::slice::from_ref(&x)).unwrap().to_vec().unwrap();
        assert_eq!(got, [8.0, 6.0, 2.0]);
        assert_eq!(Expr::parse("y @ w + b * x").unwrap().input_names(), ["y", "w", "b", "x"]);
    }

    #[test]
    fn a_shape_error_comes_from_kiln_when_the_expression_runs() {
        let e = Expr::parse("x + w").unwrap();
        let args: Vec<Tensor> = e
            .specs()
            .iter()
            .map(|s| Tensor::zeros(s.shape.as_concrete().unwrap().as_slice(), DType::F32).unwrap())
            .collect();
        let err = e.eval(&args).unwrap_err().to_string();
        assert!(err.contains("[256, 1024]") && err.contains("[1024, 256]"), "{err}");
    }

    #[test]
    fn bad_input_names_the_column_and_what_was_wrong() {
        let (c, m) = column_of("x +* 2");
        assert_eq!(c, 4);
        assert!(m.contains("found `*`"), "{m}");
        let (c, m) = column_of("foo(x)");
        assert_eq!(c, 1);
        assert!(m.contains("unknown function `foo`") && m.contains("gelu"), "{m}");
        let (c, m) = column_of("x + z");
        assert_eq!(c, 5);
        assert!(m.contains("unknown input `z`"), "{m}");
        assert!(column_of("(x + 1").1.contains("expected `)`"));
        assert!(column_of("maximum(x)").1.contains("takes 2 arguments, given 1"));
        assert!(column_of("2 + 3").1.contains("uses no input"));
        assert!(column_of("x # 2").1.contains("not part of the language"));
        assert!(column_of("").1.contains("empty"));
        assert!(column_of("x y").1.contains("expected an operator"));
        assert!(column_of(&format!("{}x{}", "(".repeat(10_000), ")".repeat(10_000))).1.contains("nested more than"));
        assert!(column_of(&format!("{}x", "-".repeat(10_000))).1.contains("nested more than"));
        assert!(Expr::parse(&format!("{}x{}", "(".repeat(30), ")".repeat(30))).is_ok());
    }
}
