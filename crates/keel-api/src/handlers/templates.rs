//! Asset templates: the list.

use crate::ApiState;
use crate::dto::{Template, TemplateList};
use crate::extract::Authed;
use crate::page::{self, Page, PageParams};
use crate::problem::Problem;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};

use super::*;

/// List the caller's asset templates, by id (paginated).
///
/// A template holds the server-side settings of the assets created from it (chain,
/// price decimals, staleness bound, approval threshold, funding pause); `POST
/// /v1/assets` names one by `templateId`.
#[utoipa::path(
    get,
    path = "/v1/templates",
    tag = "assets",
    operation_id = "listTemplates",
    params(PageParams),
    responses(
        (status = 200, description = "One page of the organization's templates.", body = TemplateList),
        ReadErrors,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn templates(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    page: Result<Query<PageParams>, QueryRejection>,
) -> Result<Response, Problem> {
    let page = PageParams::from_query(page)?;
    let limit = page.limit()?;
    let after: Option<String> = page.cursor()?;
    if after
        .as_deref()
        .is_some_and(|id| !keel_workflows::tenancy::valid_template_id(id))
    {
        return Err(page::invalid_cursor());
    }
    let rows = state
        .ops()
        .templates(caller, after.as_deref(), limit)
        .await?;
    let page = Page::from_rows(rows, limit, |t| t.template.id.clone()).map(Template::from);
    Ok(Json(TemplateList::from(page)).into_response())
}
